"""How many KV slots the pool gets, and whether sliding-window layers get a pool of their own.

``kv_layout`` decides once, after the weights are loaded: the full pool's slots
(``--max-total-tokens``, else ``mem_fraction_static`` of the free memory) and, for a model with
sliding-window layers, the sliding pool (``mem_cache/swa_slots.py``): ``swa_full_tokens_ratio``
sliding slots per full slot, never fewer than one request's window plus a prefill chunk (so a
request can always run alone), never more than the full slots.  With a memory budget the
sliding pool's smaller rows buy more full slots for the same bytes.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Optional

import torch

from radixserve.attention.base import LayerAttention
from radixserve.config import CacheConfig, SchedulerConfig
from radixserve.mem_cache.kv_pool import KVPool

_MARGIN = 64  # sliding slots beyond one window and chunk (speculative tokens, decode)


class KVLayout(NamedTuple):
    num_slots: int
    sliding_layers: tuple[int, ...] = ()  # empty: one pool for every layer
    num_swa_slots: int = 0
    window: int = 0  # the longest sliding window


def free_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 4 << 30


def sliding_plan(layers: list[LayerAttention], cache_cfg: CacheConfig, context_len: int,
                 backend_ok: bool) -> tuple[tuple[int, ...], int]:
    """(the sliding layers, their longest window) when they get a pool of their own, else
    ((), 0): no sliding layer, a window as long as the context, ``disable_hybrid_swa_memory``,
    warm restart or the hierarchical cache on (they move full layers only), or a backend without
    the sliding pool."""
    sliding = tuple(i for i, la in enumerate(layers) if la.sliding_window is not None)
    off = cache_cfg.disable_hybrid_swa_memory or cache_cfg.persists or cache_cfg.tiered
    if not sliding or off or not backend_ok:
        return (), 0
    window = max(layers[i].sliding_window for i in sliding)
    return (sliding, window) if window + _MARGIN < context_len else ((), 0)


def pool_dtype(cache_cfg: CacheConfig, model_dtype: torch.dtype) -> torch.dtype:
    """The dtype the pool takes and gives K/V in: the model's, or bf16 for ``kv_cache_dtype=bf16``."""
    return torch.bfloat16 if cache_cfg.kv_cache_dtype == "bf16" else model_dtype


def pool_quant(cache_cfg: CacheConfig) -> Optional[str]:
    """The pool's packed format (``mem_cache/kv_quant.py``), None for an exact pool."""
    return cache_cfg.kv_cache_dtype if cache_cfg.kv_quantized else None


def kv_layout(config: Any, cache_cfg: CacheConfig, sched_cfg: SchedulerConfig, dtype: torch.dtype,
              device: torch.device, kv_shape: tuple[int, int, bool], context_len: int,
              sliding: tuple[int, ...] = (), window: int = 0, free_bytes: Optional[int] = None,
              held: Optional[range] = None) -> KVLayout:
    """The pool sizes (slot 0 included in each); ``kv_shape``: the model's ``kv_cache_shape()``
    on this rank (heads, head_dim, shared K/V); ``sliding``/``window``: ``sliding_plan``'s; ``dtype``:
    ``pool_dtype``'s (a quantized pool's bytes come from ``cache_cfg.kv_cache_dtype``); ``held``: the
    layers a pipeline stage holds (default all), the only ones its memory budget pays for."""
    heads, head_dim, shared = kv_shape
    layers = config.num_hidden_layers if held is None else len(held)
    n_sliding = len(sliding) if held is None else len(set(sliding) & set(held))
    ratio = cache_cfg.swa_full_tokens_ratio if sliding else 0.0
    if cache_cfg.max_total_tokens:
        num_slots = int(cache_cfg.max_total_tokens) + 1
    else:
        quant = pool_quant(cache_cfg)
        full = KVPool.bytes_per_slot(layers - n_sliding, heads, head_dim, dtype, shared, quant)
        swa = KVPool.bytes_per_slot(n_sliding, heads, head_dim, dtype, shared, quant)
        budget = int((free_memory_bytes(device) if free_bytes is None else free_bytes) * cache_cfg.mem_fraction_static)
        num_slots = max(2, int(budget // max(1.0, full + swa * ratio)))
    if not sliding:
        return KVLayout(num_slots)
    chunk = sched_cfg.chunked_prefill_size if sched_cfg.chunked_prefill_size and sched_cfg.chunked_prefill_size > 0 \
        else context_len
    least = window + min(chunk, context_len) + sched_cfg.speculative_num_tokens + _MARGIN
    num_swa = max(least, int(num_slots * ratio))
    return KVLayout(num_slots, sliding, num_swa, window) if num_swa < num_slots else KVLayout(num_slots)
