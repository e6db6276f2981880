"""``RemoteWorker``: the scheduler's handle on a worker process.

It has the same ``step(plan) -> StepResult`` as ``ModelRunner``, so the existing Scheduler
drives a remote worker unchanged; ``save_prefixes``/``restore_prefixes`` are warm restart's
two requests (the same methods as the in-process ``PrefixStore``), ``apply_tiers`` the
hierarchical cache's (as the in-process ``TierStore``).  ``step`` sends the plan
and blocks for the reply; a ``WorkerError`` reply raises ``WorkerStepError`` with the failed
plan attached.  With a
``dead`` callback (the Engine's tensor-parallel group) ``step`` waits in short polls and
raises ``WorkerDied`` once it names a dead process, instead of blocking forever.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import zmq

from radixserve.ipc.persist_link import KVRestoreReply, KVRestoreReq, KVSaveReply, KVSaveReq
from radixserve.ipc.tier_link import KVTierReply, KVTierReq
from radixserve.ipc.worker_link import StepPlan, StepResult, WorkerInfo
from radixserve.ipc.zmq_utils import IPCAddrs, make_socket, recv_obj, send_obj
from radixserve.worker.process import WorkerError


class WorkerStepError(RuntimeError):
    def __init__(self, message: str, plan: StepPlan) -> None:
        super().__init__(message)
        self.plan = plan


class WorkerDied(RuntimeError):
    pass


class RemoteWorker:
    def __init__(self, ctx: zmq.Context, addrs: IPCAddrs, dead: Optional[Callable[[], Optional[str]]] = None) -> None:
        self.to_worker = make_socket(ctx, zmq.PUSH, addrs.sched_to_worker, bind=False)
        self.from_worker = make_socket(ctx, zmq.PULL, addrs.worker_to_sched, bind=True)
        self.num_steps = 0
        self.dead = dead

    def wait_ready(self) -> WorkerInfo:
        """Block until the worker has loaded the model."""
        info = recv_obj(self.from_worker)
        assert isinstance(info, WorkerInfo), f"expected WorkerInfo, got {type(info).__name__}"
        return info

    def step(self, plan: StepPlan) -> StepResult:
        send_obj(self.to_worker, plan)
        while self.dead is not None and not self.from_worker.poll(500):
            if (reason := self.dead()) is not None:
                raise WorkerDied(f"model worker: {reason}")
        reply = recv_obj(self.from_worker)
        self.num_steps += 1
        if isinstance(reply, WorkerError):
            raise WorkerStepError(reply.message, plan)
        return reply

    def save_prefixes(self, req: KVSaveReq) -> KVSaveReply:
        """Warm restart: the worker copies these slots' KV out (and writes the file)."""
        send_obj(self.to_worker, req)
        reply = recv_obj(self.from_worker)
        return KVSaveReply(False, reply.message) if isinstance(reply, WorkerError) else reply

    def restore_prefixes(self, req: KVRestoreReq) -> KVRestoreReply:
        """Warm restart: the worker fills these reserved slots from its file."""
        send_obj(self.to_worker, req)
        reply = recv_obj(self.from_worker)
        return KVRestoreReply(message=f"worker error: {reply.message}") if isinstance(reply, WorkerError) else reply

    def lora_request(self, req: Any) -> Any:
        """LoRA: the worker loads or unloads an adapter (``worker/lora/manager.py``)."""
        from radixserve.ipc.lora_link import LoRAReply

        send_obj(self.to_worker, req)
        reply = recv_obj(self.from_worker)
        return LoRAReply(error=f"lora_path: worker error: {reply.message}") if isinstance(reply, WorkerError) else reply

    def apply_tiers(self, req: KVTierReq) -> KVTierReply:
        """Hierarchical cache: the worker carries out these moves (a worker error fails them all)."""
        send_obj(self.to_worker, req)
        reply = recv_obj(self.from_worker)
        if isinstance(reply, WorkerError):
            return KVTierReply(list(range(len(req.moves))), [], reply.message)
        return reply
