"""Builds the model worker: weights, KV (``kv_setup.py``), attention and sampler, and the limits it reports.

Used by the worker process and by the in-process ``Engine`` (the one place the worker is wired),
and by every tensor-parallel rank (with its group, ``parallel/``).
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Optional

from radixserve.config import EngineConfig
from radixserve.ipc.worker_link import WorkerInfo
from radixserve.model import loader
from radixserve.utils import tune_malloc
from radixserve.worker.model_runner import ModelRunner, set_threads

logger = logging.getLogger(__name__)


def check_config(cfg: EngineConfig) -> None:
    """Raise ValueError naming an option this runtime does not implement."""
    if cfg.cache.page_size != 1:
        raise ValueError("page_size: only page size 1 is implemented")
    par = cfg.parallel
    if par.world_size > 1:
        multi = "tp_size > 1" if par.pp_size == 1 else "pp_size > 1"
        holds = "its KV heads" if par.pp_size == 1 else "its stage's layers"
        if cfg.model.quantization not in ("none", "auto"):
            raise ValueError(f"quantization: {cfg.model.quantization} is not implemented with {multi} "
                             "(use none)")
        if cfg.scheduler.speculative_algorithm == "draft":
            raise ValueError(f"speculative_algorithm: draft is not implemented with {multi} (use ngram or none)")
        if cfg.cache.cache_persist_dir:
            raise ValueError(f"cache_persist_dir: warm restart is not implemented with {multi} "
                             f"(each rank holds only {holds})")
        if cfg.cache.enable_hierarchical_cache:
            raise ValueError(f"enable_hierarchical_cache: the hierarchical cache is not implemented with {multi} "
                             f"(each rank holds only {holds})")
        if par.tp_size > 1:
            _check_model_splits(cfg)
        if par.pp_size > 1:
            from radixserve.worker.pp.checks import check_pipeline

            check_pipeline(cfg)
    if cfg.lora.enable_lora:
        if par.world_size > 1:
            raise ValueError("enable_lora: LoRA adapters are not implemented with tp_size > 1 or pp_size > 1")
        if cfg.scheduler.speculative_algorithm == "draft":
            raise ValueError("speculative_algorithm: draft is not implemented with LoRA adapters (the draft model "
                             "has none; use ngram or none)")


def _check_model_splits(cfg: EngineConfig) -> None:
    """An architecture that cannot be split over ranks is refused here, before any rank starts."""
    from radixserve.model.registry import model_class

    config = loader.load_config(loader.resolve_hf_dir(cfg.model.path))
    refusal = model_class(config).tp_unsupported
    if refusal:
        raise ValueError(f"tp_size: tensor parallelism with {refusal} ({config.model_type}) is not supported "
                         f"(use tp_size 1)")


def tp_model_config(cfg: EngineConfig) -> EngineConfig:
    """With several ranks (``tp_size * pp_size > 1``), ``quantization`` "auto" means "none"
    (TP shards and PP stages hold dense weights only)."""
    if cfg.parallel.world_size > 1 and cfg.model.quantization == "auto":
        return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, quantization="none"))
    return cfg


def build_worker(cfg: EngineConfig, show_progress: bool = True, tp: Any = None) -> tuple[ModelRunner, WorkerInfo]:
    """Load the model; returns (ModelRunner, the WorkerInfo it reports to the scheduler).
    ``tp``: this rank's tensor-parallel group (``parallel.init.join``), None for one rank; with a
    pipeline (its ``pipe`` set) the runner is the stage's ``worker/pp/runner.PipelineRunner``."""
    check_config(cfg)
    cfg = tp_model_config(cfg)
    tune_malloc()
    set_threads(len(cfg.parallel.local_ranks()))
    hf_dir = loader.resolve_hf_dir(cfg.model.path, show_progress)
    runner = ModelRunner(cfg.model, cfg.cache, cfg.scheduler, hf_dir, show_progress, tp)
    if cfg.lora.enable_lora:
        from radixserve.worker.lora.manager import LoRAManager

        runner.lora = LoRAManager(runner.model, cfg.lora, runner.dtype, runner.device)
    pool = runner.kv_pool
    if getattr(tp, "pipe", None) is not None:
        from radixserve.worker.pp.runner import PipelineRunner

        runner = PipelineRunner(runner, tp.pipe, cfg.parallel.pp_micro_batches)
    info = WorkerInfo(num_slots=runner.kv_pool.num_slots, max_rows=runner.req_to_token.size,
                      context_len=runner.context_len, vocab_size=runner.vocab_size,
                      dtype=str(runner.dtype).removeprefix("torch."), device=str(runner.device), hf_dir=hf_dir,
                      quantization=runner.numerics.quant_label(), hidden_size=int(runner.config.hidden_size),
                      kv_bytes_per_slot=pool.slot_bytes, swa_slots=pool.num_swa_slots,
                      swa_window=runner.kv_layout.window if pool.hybrid else 0,
                      host_tier_slots=runner.kv.host_tier_slots(cfg.cache),
                      lora=runner.lora.info if runner.lora is not None else None,
                      doc_reuse_refusal=doc_reuse_refusal(runner))
    return runner, info


def doc_reuse_refusal(runner: Any) -> Optional[str]:
    """Why this worker cannot place reused documents at other positions (None: it can)."""
    from radixserve.worker.doc_kv import refusal

    model = getattr(runner, "model", None)
    if model is None or not hasattr(model, "layer_rotary"):
        return "this runner (no per-layer rotary embedding to move the keys with)"
    rotaries = []
    for i in range(runner.kv_pool.num_layers):
        try:
            rotaries.append(model.layer_rotary(i))
        except (AttributeError, IndexError):
            rotaries.append(None)
    return refusal(runner.kv_pool, rotaries, runner.backend.name)
