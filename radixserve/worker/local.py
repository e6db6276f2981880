"""``LocalWorker``: rank 0's model worker inside the scheduler process (one rank, as SGLang runs it).

It answers the ``RemoteWorker`` interface (``wait_ready``, ``step``, ``save_prefixes``,
``restore_prefixes``, ``lora_request``, ``apply_tiers``, ``num_steps``) by calling the
``ModelRunner`` and its stores directly, with the error contract of the worker process: a step
that raises is logged and raises ``WorkerStepError`` carrying the failed plan (the scheduler then
fails only that step's requests); a warm-restart, LoRA or tier request that raises gets the same
refusal reply a worker process would send.  No message is pickled and no process is woken: on a
2-core CPU the ZeroMQ hop between the two processes cost about 1 ms per decode step.

Used by the scheduler process when the model has one rank (``tp_size * pp_size == 1``); with
several ranks, rank 0 stays a worker process of its own (``worker/process.py``) that broadcasts
each plan to the others.  Not thread-safe: the scheduler loop is its only caller.
"""
from __future__ import annotations

import threading
from typing import Any

from radixserve.config import EngineConfig
from radixserve.ipc.lora_link import LoRAReq
from radixserve.ipc.persist_link import KVRestoreReply, KVRestoreReq, KVSaveReply, KVSaveReq
from radixserve.ipc.tier_link import KVTierReply, KVTierReq
from radixserve.ipc.worker_link import StepPlan, StepResult, WorkerInfo
from radixserve.worker.process import WorkerError, _step
from radixserve.worker.remote import WorkerStepError


class LocalWorker:
    def __init__(self, runner: Any, info: WorkerInfo, store: Any = None, tiers: Any = None) -> None:
        self.runner, self.info, self.store, self.tiers = runner, info, store, tiers
        self.num_steps = 0

    @classmethod
    def build(cls, cfg: EngineConfig) -> "LocalWorker":
        """Load the model of a one-rank ``cfg`` here (``worker/build.py``), with its warm-restart
        and tier stores; raises what loading raises (the process then exits, as a worker would)."""
        from tqdm import tqdm

        from radixserve.parallel.init import join
        from radixserve.worker.build import build_worker
        from radixserve.worker.kv_setup import build_prefix_store, build_tier_store
        from radixserve.worker.model_runner import resolve_device

        assert cfg.parallel.world_size == 1, "LocalWorker runs one rank; several ranks use worker processes"
        tqdm.set_lock(threading.RLock())  # not tqdm's multiprocessing lock: a killed process would leak it
        runner, info = build_worker(cfg, tp=join(cfg.parallel, 0, resolve_device(cfg.model.device)))
        return cls(runner, info, build_prefix_store(cfg, runner, info), build_tier_store(cfg, runner, info))

    def wait_ready(self) -> WorkerInfo:
        return self.info

    def step(self, plan: StepPlan) -> StepResult:
        reply = _step(self.runner, plan)
        self.num_steps += 1
        if isinstance(reply, WorkerError):
            raise WorkerStepError(reply.message, plan)
        return reply

    def save_prefixes(self, req: KVSaveReq) -> KVSaveReply:
        reply = _step(self.runner, req, self.store, self.tiers)
        return KVSaveReply(False, reply.message) if isinstance(reply, WorkerError) else reply

    def restore_prefixes(self, req: KVRestoreReq) -> KVRestoreReply:
        reply = _step(self.runner, req, self.store, self.tiers)
        return KVRestoreReply(message=f"worker error: {reply.message}") if isinstance(reply, WorkerError) else reply

    def lora_request(self, req: LoRAReq) -> Any:
        from radixserve.ipc.lora_link import LoRAReply

        reply = _step(self.runner, req, self.store, self.tiers)
        return LoRAReply(error=f"lora_path: worker error: {reply.message}") if isinstance(reply, WorkerError) else reply

    def apply_tiers(self, req: KVTierReq) -> KVTierReply:
        reply = _step(self.runner, req, self.store, self.tiers)
        if isinstance(reply, WorkerError):
            return KVTierReply(list(range(len(req.moves))), [], reply.message)
        return reply
