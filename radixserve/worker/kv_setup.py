"""The worker's KV, built in one place: the pool in its form, the sliding-window pool, the
request->slot tables, the attention backend over them, and the tiers and warm-restart store
that copy the pool's rows.

Contract:
- ``build_kv(model, ...)`` runs once, after the weights are loaded (the pool takes what memory
  they leave).  It checks a lossy pool form against this model (``tuning/kv_accuracy.py``),
  sizes the pools (``kv_sizing.kv_layout``; tensor-parallel ranks agree on the smallest) and
  returns a ``KVSetup``; it raises ValueError naming the option a model cannot take.
- ``KVSetup`` is read-only for its users: the model runner steps over its tables,
  ``WorkerInfo`` (which the scheduler and the cache inspector read) takes its sizes, and
  ``build_tier_store`` / ``build_prefix_store`` (the tiers, warm restart) read its ``pools``
  through ``runner.kv``.  The draft model's pool (speculative decoding) joins ``pools`` through
  ``add_draft_pool``; the caller frees nothing (the pools live as long as the worker).
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field, replace
from typing import Any, Optional

import torch

from radixserve.attention.base import AttentionBackend
from radixserve.attention.registry import create_attention_backend, sliding_pool_supported
from radixserve.config import CacheConfig, EngineConfig, SchedulerConfig
from radixserve.ipc.worker_link import WorkerInfo
from radixserve.mem_cache.kv_pool import KVPool
from radixserve.mem_cache.req_to_token import ReqToTokenPool
from radixserve.model import loader
from radixserve.proc import stages
from radixserve.worker.kv_sizing import KVLayout, kv_layout, pool_dtype, pool_quant, sliding_plan
from radixserve.worker.persist.store import PrefixStore, fingerprint
from radixserve.worker.tiers.block_store import BlockStore
from radixserve.worker.tiers.host_tier import TierStore, host_slot_bytes
from radixserve.worker.tuning import attention_timing, kv_accuracy

logger = logging.getLogger(__name__)


@dataclass
class KVSetup:
    """The worker's KV state (see the module docstring for who reads what)."""

    layout: KVLayout
    pool: KVPool
    req_to_token: ReqToTokenPool
    swa_table: Optional[torch.Tensor]  # the sliding layers' request->slot table (a hybrid pool only)
    backend: AttentionBackend
    draft_pool: Optional[KVPool] = field(default=None)

    @property
    def pools(self) -> list[KVPool]:
        """The pools whose rows the tiers and warm restart copy: the model's, then a draft model's."""
        return [self.pool] + ([self.draft_pool] if self.draft_pool is not None else [])

    def add_draft_pool(self, pool: Optional[KVPool]) -> None:
        self.draft_pool = pool

    def host_tier_slots(self, cache_cfg: CacheConfig) -> int:
        """How many tokens the host tier holds (0: the hierarchical cache is off)."""
        return cache_cfg.host_tier_slots(sum(p.total_bytes for p in self.pools),
                                         host_slot_bytes(self.pools, cache_cfg.hicache_kv_dtype))


def build_kv(model: Any, config: Any, hf_dir: str, cache_cfg: CacheConfig, sched_cfg: SchedulerConfig,
             dtype: torch.dtype, device: torch.device, context_len: int, num_heads: int, tp: Any) -> KVSetup:
    """The pools, tables and attention backend for ``model`` (``num_heads``: query heads on this rank),
    as the "KV pool" start-up stage (``proc/stages.py``)."""
    with stages.stage("KV pool", f"{cache_cfg.kv_cache_dtype} form, attention backend "
                      f"{cache_cfg.attention_backend}") as progress:
        kv = _build_kv(model, config, hf_dir, cache_cfg, sched_cfg, dtype, device, context_len, num_heads, tp)
        progress.result(f"{kv.pool.num_slots} slots of {kv.pool.dtype}"
                        f"{' ' + kv.pool.quant if kv.pool.quant else ''}, {kv.backend.name} attention")
    return kv


def _build_kv(model: Any, config: Any, hf_dir: str, cache_cfg: CacheConfig, sched_cfg: SchedulerConfig,
              dtype: torch.dtype, device: torch.device, context_len: int, num_heads: int, tp: Any) -> KVSetup:
    kv_shape = model.kv_cache_shape()
    layers = model.layer_attention()
    sliding, window = sliding_plan(layers, cache_cfg, context_len, sliding_pool_supported(cache_cfg.attention_backend))
    kv_dtype = pool_dtype(cache_cfg, dtype)
    if cache_cfg.kv_quantized and kv_shape[2]:
        raise ValueError("kv_cache_dtype: this model's multi-head latent attention keeps one compressed KV "
                         "per token; a quantized pool is not offered for it (use auto or bf16)")
    # a lossy pool form must keep this model's predictions (ranks measure alike, uncached, in step)
    kv_accuracy.check_pool_form(model, hf_dir, cache_cfg, dtype, kv_dtype, None if tp.size == 1 else "")
    held = model.stage.layers  # (a pipeline stage's pool holds its layers only)
    layout = kv_layout(config, cache_cfg, sched_cfg, kv_dtype, device, kv_shape, context_len, sliding, window,
                       held=held)
    num_slots = tp.min_int(layout.num_slots)
    if num_slots != layout.num_slots:  # ranks agree on the smallest (the sliding pool follows)
        layout = kv_layout(config, replace(cache_cfg, max_total_tokens=num_slots - 1), sched_cfg, kv_dtype, device,
                           kv_shape, context_len, sliding, window, held=held)
    kv_heads, head_dim, shared = kv_shape
    pool = KVPool(num_slots, config.num_hidden_layers, kv_heads, head_dim, kv_dtype, device, shared,
                  layout.sliding_layers, layout.num_swa_slots, pool_quant(cache_cfg), held)
    req_to_token = ReqToTokenPool(sched_cfg.max_running_requests + 8, context_len + 1, device)
    swa_table = torch.zeros_like(req_to_token.table) if pool.hybrid else None
    backend = create_attention_backend(cache_cfg.attention_backend, pool, device,
                                       attention_timing.rule_for(num_heads // kv_heads), layers=layers)
    return KVSetup(layout, pool, req_to_token, swa_table, backend)


def build_tier_store(cfg: EngineConfig, runner: Any, info: WorkerInfo) -> Optional[TierStore]:
    """The hierarchical cache's host (and disk) tier over ``runner.kv.pools``, when it is on."""
    if not info.host_tier_slots:
        return None
    kv: KVSetup = runner.kv
    blocks = None
    if cfg.cache.hicache_storage_backend == "file":
        folder = cfg.cache.hicache_storage_dir or os.path.join(loader.cache_root(), "hicache")
        fp = fingerprint(runner.config, info.hf_dir, kv.pool, info.quantization, cfg.cache.page_size)
        try:
            blocks = BlockStore(folder, fp)
        except OSError as e:
            raise ValueError(f"hicache_storage_dir: cannot use {folder!r} for the disk tier: {e}") from None
    store = TierStore(kv.pools, info.host_tier_slots, blocks, cfg.cache.hicache_kv_dtype)
    logger.info("hierarchical cache: host tier of %d tokens (%.2f GB, %s)%s", info.host_tier_slots,
                store.host_bytes / 1e9, cfg.cache.hicache_kv_dtype,
                f", disk tier of {cfg.cache.hicache_storage_size:g} GB in {blocks.folder}" if blocks else "")
    return store


def build_prefix_store(cfg: EngineConfig, runner: Any, info: WorkerInfo) -> Optional[PrefixStore]:
    """The warm-restart store over ``runner.kv.pool``, when ``cache_persist_dir`` is set."""
    if cfg.cache.persists and cfg.parallel.world_size > 1:
        raise ValueError("cache_persist_dir: warm restart is not implemented with tp_size or pp_size > 1 "
                         "(each rank holds only part of the KV)")
    if not cfg.cache.persists:
        if cfg.cache.cache_persist_dir:
            logger.warning("cache_persist_dir ignored: disable_radix_cache leaves nothing to persist")
        return None
    pool = runner.kv.pool
    return PrefixStore(pool, fingerprint(runner.config, info.hf_dir, pool, info.quantization, cfg.cache.page_size),
                       cfg.cache.cache_persist_dir)
