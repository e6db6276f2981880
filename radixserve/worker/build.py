"""Builds the model worker: weights, KV pools, attention and sampler, and the limits it reports.

Used by the worker process and by the in-process ``Engine`` (the one place the worker is wired).
"""
from __future__ import annotations

import logging
from typing import Optional

from radixserve.config import EngineConfig
from radixserve.ipc.worker_link import WorkerInfo
from radixserve.mem_cache.kv_pool import KVPool
from radixserve.model import loader
from radixserve.utils import tune_malloc
from radixserve.worker.model_runner import ModelRunner, set_threads
from radixserve.worker.prefix_store import PrefixStore, fingerprint

logger = logging.getLogger(__name__)


def check_config(cfg: EngineConfig) -> None:
    """Raise ValueError naming an option this runtime does not implement."""
    if cfg.cache.page_size != 1:
        raise ValueError("page_size: only page size 1 is implemented")


def build_worker(cfg: EngineConfig, show_progress: bool = True) -> tuple[ModelRunner, WorkerInfo]:
    """Load the model; returns (ModelRunner, the WorkerInfo it reports to the scheduler)."""
    check_config(cfg)
    tune_malloc()
    set_threads()
    hf_dir = loader.resolve_hf_dir(cfg.model.path, show_progress)
    runner = ModelRunner(cfg.model, cfg.cache, cfg.scheduler, hf_dir, show_progress)
    pool = runner.kv_pool
    info = WorkerInfo(num_slots=runner.kv_pool.num_slots, max_rows=runner.req_to_token.size,
                      context_len=runner.context_len, vocab_size=runner.vocab_size,
                      dtype=str(runner.dtype).removeprefix("torch."), device=str(runner.device), hf_dir=hf_dir,
                      quantization=runner.numerics.quant_label(), hidden_size=int(runner.config.hidden_size),
                      kv_bytes_per_slot=KVPool.bytes_per_slot(pool.num_layers, pool.num_kv_heads, pool.head_dim,
                                                              pool.dtype))
    return runner, info


def build_prefix_store(cfg: EngineConfig, runner: ModelRunner, info: WorkerInfo) -> Optional[PrefixStore]:
    """The warm-restart store over the runner's KV pool, when ``cache_persist_dir`` is set."""
    if not cfg.cache.persists:
        if cfg.cache.cache_persist_dir:
            logger.warning("cache_persist_dir ignored: disable_radix_cache leaves nothing to persist")
        return None
    fp = fingerprint(runner.config, info.hf_dir, runner.kv_pool, info.quantization, cfg.cache.page_size)
    return PrefixStore(runner.kv_pool, fp, cfg.cache.cache_persist_dir)
