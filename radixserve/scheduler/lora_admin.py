"""LoRA adapters on the scheduler's side: loading and unloading them on the worker between
steps, and the admission limit of ``max_loras_per_batch`` distinct adapters running at once
(``admission.admit_waiting`` keeps it, from ``active``).

Unloading: the request side forgets the name first (new requests naming it are 400s); the
worker drops the weights once no queued or running request uses the adapter (``collect``,
called before every step).  Scheduler thread only.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Optional


class LoRAAdmin:
    def __init__(self, worker: Any, max_loras: int) -> None:
        """``max_loras``: the worker's slots (0: LoRA is off, no limit applies)."""
        self.worker = worker
        self.max_loras = max_loras
        self.pending: set[str] = set()  # uids to unload once no request uses them

    def active(self, running: Iterable[Any]) -> Optional[set[str]]:
        """The adapters of ``running`` (None: no limit to keep)."""
        return {r.lora for r in running if r.lora is not None} if self.max_loras else None

    def load(self, name: str, path: str) -> Any:
        """The worker reads the adapter into its host pool; its ``AdapterInfo``, or ValueError
        naming the field."""
        from radixserve.ipc.lora_link import LoRAReq

        if not self.max_loras:
            raise ValueError("lora_path: LoRA adapters are not enabled on this server (start it with --enable-lora)")
        reply = self.worker.lora_request(LoRAReq("load", name, path))
        if reply.error:
            raise ValueError(reply.error)
        self.pending.discard(reply.info.uid)  # the same files loaded again before the unload happened
        return reply.info

    def unload(self, uid: str, in_use: Callable[[str], int]) -> int:
        """Drop adapter ``uid`` now, or once its ``in_use(uid)`` requests are done; returns that count."""
        n = in_use(uid)
        if n:
            self.pending.add(uid)
        else:
            self._drop(uid)
        return n

    def collect(self, in_use: Callable[[str], int]) -> None:
        for uid in [u for u in self.pending if not in_use(u)]:
            self._drop(uid)

    def _drop(self, uid: str) -> None:
        from radixserve.ipc.lora_link import LoRAReq

        self.pending.discard(uid)
        self.worker.lora_request(LoRAReq("unload", uid=uid))
