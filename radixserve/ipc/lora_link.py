"""LoRA's messages between the scheduler and the worker (``worker/lora/manager.py``), and what
the worker reports of its adapters in ``WorkerInfo.lora``.  Light (no torch): the server reads
``LoRAWorkerInfo`` too."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from radixserve.lora.adapter import AdapterInfo


@dataclass
class LoRAReq:
    """Scheduler -> worker, between steps: ``op`` "load" (``name``, ``path``) or "unload" (``uid``)."""

    op: str
    name: str = ""
    path: str = ""
    uid: str = ""


@dataclass
class LoRAReply:
    info: Optional[AdapterInfo] = None
    error: Optional[str] = None  # "<field>: ..." (a 400 for the client)


@dataclass
class LoRAWorkerInfo:
    """What the slots hold, and the adapters loaded at start (``WorkerInfo.lora``)."""

    rank: int
    targets: frozenset[str]
    max_loras_per_batch: int
    adapters: list[AdapterInfo] = field(default_factory=list)
