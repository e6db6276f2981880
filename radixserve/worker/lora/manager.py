"""``LoRAManager``: the worker's adapters (docs/LORA.md): the host pool and slots (``slots.py``),
each request's adapter, and the step's deltas (``step.py``) installed on the model's layers.

Contract: ``begin(plan)`` before the step's forward (records the adapter of each request that
enters, ``ReqInit.sampling.lora_path``: a uid, and puts the step's adapters in slots), ``end()``
after it, also when it raised.  A step whose requests use no adapter leaves the model exactly as
without LoRA.  ``request(LoRAReq)`` loads or unloads an adapter between steps; the scheduler
never unloads an adapter a running request uses.  Worker thread only.
"""
from __future__ import annotations

import logging
from typing import Any, Optional

import numpy as np
import torch

from radixserve.ipc.lora_link import LoRAReply, LoRAReq, LoRAWorkerInfo
from radixserve.lora.adapter import read_adapter
from radixserve.lora_config import TARGET_MODULES, LoRAConfig
from radixserve.worker.lora.slots import LoRASlots
from radixserve.worker.lora.step import LoRAHolder, LoRAStep

logger = logging.getLogger(__name__)


def install(model: Any, holder: LoRAHolder) -> None:
    """Point every layer's attention and MLP at ``holder`` (the module path reads it there; the
    native layer loop gets the step from ``DecoderLM.final_hidden``)."""
    model.lora = holder
    for i, layer in enumerate(model.layers):
        layer.self_attn.lora = holder
        layer.mlp.lora = holder
        layer.mlp.lora_layer = layer.self_attn.layer_id if hasattr(layer.self_attn, "layer_id") else i


def _measured_limit(slots: LoRASlots) -> int:
    """``timing.measured_limit`` where the native kernel runs (a CPU with the library), else 0
    (the stacked GEMMs at every row count)."""
    import os

    from radixserve.kernels import cpu_native
    from radixserve.model import loader
    from radixserve.worker.lora import timing

    if slots.device.type != "cpu" or not cpu_native.load():
        return 0
    limit = timing.measured_limit(slots, os.path.join(loader.cache_root(), "lora_timings.json"))
    logger.info("LoRA: the native segmented kernel below %s rows a step, stacked GEMMs from there",
                "any number of" if limit == timing.NO_LIMIT else limit)
    return limit


class LoRAManager:
    def __init__(self, model: Any, cfg: LoRAConfig, dtype: torch.dtype, device: torch.device) -> None:
        start = [read_adapter(name, path, "lora_paths", cfg.max_lora_rank, cfg.targets) for name, path in cfg.adapters]
        rank = cfg.max_lora_rank or max(a.rank for a in start)
        targets = cfg.targets or frozenset().union(*(a.targets for a in start)) or frozenset(TARGET_MODULES)
        self.slots = LoRASlots(model, cfg.max_loras_per_batch, rank, targets, dtype, device)
        self.adapters = [self.slots.load(name, path, "lora_paths") for name, path in cfg.adapters]
        self.holder = LoRAHolder()
        install(model, self.holder)
        self.of: dict[str, str] = {}  # rid -> adapter uid, for the requests that have one
        self.sgmv: Optional[bool] = None  # the deltas' path pinned (tests), else chosen per step
        self.sgmv_below = _measured_limit(self.slots)  # rows below which the native kernel runs (timing.py)
        self.info = LoRAWorkerInfo(rank, targets, cfg.max_loras_per_batch, list(self.adapters))
        logger.info("LoRA: %d adapter(s) at start (%s), %d slots of rank %d over %s", len(self.adapters),
                    ", ".join(a.name for a in self.adapters) or "none", cfg.max_loras_per_batch, rank,
                    ", ".join(sorted(targets)))

    def begin(self, plan: Any) -> None:
        for rid in plan.release:
            self.of.pop(rid, None)
        for r in plan.reqs:
            if r.init is not None:
                uid = r.init.sampling.lora_path
                if uid:
                    self.of[r.rid] = uid
                else:
                    self.of.pop(r.rid, None)
        uids = [self.of.get(r.rid) for r in plan.reqs]
        if not any(uids):
            self.holder.step = None
            return
        slot = self.slots.assign([u for u in uids if u])
        per_req = [slot[u] if u else -1 for u in uids]
        lens = [len(r.input_ids) for r in plan.reqs]
        row_slot = torch.from_numpy(np.repeat(np.asarray(per_req, dtype=np.int64), lens)).to(self.slots.device)
        sgmv = self.sgmv if self.sgmv is not None else len(row_slot) < self.sgmv_below
        self.holder.step = LoRAStep(self.slots, row_slot, sgmv)

    def end(self) -> None:
        self.holder.step = None

    def request(self, req: LoRAReq) -> LoRAReply:
        try:
            if req.op == "load":
                return LoRAReply(self.slots.load(req.name, req.path, "lora_path"))
            if req.op == "unload":
                self.slots.unload(req.uid)
                return LoRAReply()
            return LoRAReply(error=f"op: unknown LoRA request {req.op!r}")
        except ValueError as e:
            return LoRAReply(error=str(e))
