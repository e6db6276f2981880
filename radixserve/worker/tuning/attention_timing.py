"""Which extend blocks the CPU attention backend gives to torch's flash attention: measured.

Big blocks of query rows (a prompt's own causal block, a shared prefix under many members'
tokens) can run either in the native kernel or in ``_scaled_dot_product_flash_attention_for_cpu``
(see ``attention/cpu_backend.py``).  Which is faster depends on the CPU: on the AMX Xeon flash
attention won shared prefixes (16 ms against 77 per layer), the kernel's AMX blocks won causal
ones; on an AMD Zen 4 (AVX-512 BF16, no AMX) the kernel won causal blocks (ShareGPT's extend
steps 12.1 s against 15.3 s end to end).  So ``dense_rule`` times both on one layer of the
model's head layout, for a causal block and a shared prefix at ``SIZES`` query tokens, and
gives flash attention the blocks from the smallest size where it was faster.  Over a bf16 pool
it first times the kernel's blocks with and without AVX512-BF16 dot products (``row_block_avx``
on bf16 query pairs, ``kernels/cpu/attn_bf16.h``) on a prompt and a shared-prefix decode step,
and keeps the faster (Zen 4: on, 1.52 against 2.06 ms per layer for 128 decode rows under 16
shared 512-token prefixes).  About 0.5 s on the first start per machine, dtype and head layout;
cached in ``$RADIXSERVE_CACHE/attention_timings.json``.
"""
from __future__ import annotations

import functools
import logging
import os
import time
from typing import Callable, Optional

import torch

from radixserve.attention.base import ForwardBatch, ForwardMode
from radixserve.attention.cpu_backend import CpuBackend, DenseRule
from radixserve.kernels import cpu_native
from radixserve.mem_cache.kv_pool import KVPool
from radixserve.model import loader
from radixserve.proc import stages
from radixserve.worker.tuning import json_cache, noise
from radixserve.worker.tuning.kernel_timing import cpu_signature

logger = logging.getLogger(__name__)

SIZES = (512, 1536)  # query tokens of the timed blocks
MEMBERS = 8  # requests under the timed shared prefix
NEVER = 1 << 40
RETAKE_BUDGET_S = 5.0  # seconds that retakes of a noisy measurement may add (noise.py)
KINDS = ("causal_kernel", "causal_flash", "shared_kernel", "shared_flash")  # timings per size


def _batch(prefix: int, new: list[int], pool: KVPool) -> ForwardBatch:
    """Requests sharing ``prefix`` slots (0 for none), each with its ``new`` tokens after them."""
    n = len(new)
    width = prefix + max(new)
    table = torch.zeros(n, width, dtype=torch.int32)
    slot, new_slots = prefix, []
    for i, m in enumerate(new):
        table[i, :prefix] = torch.arange(prefix, dtype=torch.int32)
        table[i, prefix: prefix + m] = torch.arange(slot, slot + m, dtype=torch.int32)
        new_slots.append(torch.arange(slot, slot + m))
        slot += m
    lens = torch.tensor(new)
    pre = torch.full((n,), prefix)
    positions = torch.cat([torch.arange(prefix, prefix + m) for m in new])
    return ForwardBatch(ForwardMode.EXTEND, torch.zeros(int(lens.sum()), dtype=torch.long), positions,
                        torch.cat(new_slots), torch.arange(n), pre + lens, pre, lens, torch.cumsum(lens, 0) - lens,
                        table, (pre + lens).tolist(), pre.tolist(), new)


def _time(pool: KVPool, batch: ForwardBatch, heads: int, rule: DenseRule) -> float:
    backend = CpuBackend(pool, rule)
    q = torch.randn(batch.num_tokens, heads, pool.head_dim).to(pool.dtype)
    best = float("inf")
    for _ in range(3):
        batch.attn_metadata = None
        t0 = time.perf_counter()
        backend.init_forward_metadata(batch)
        backend.attend(q, q, q, 0, pool.head_dim ** -0.5, batch)
        best = min(best, time.perf_counter() - t0)
    return best


def measure(dtype: torch.dtype, num_kv_heads: int, head_dim: int, heads_per_kv: int,
            quant: Optional[str] = None) -> dict[str, list[float]]:
    """Seconds per layer at each of ``SIZES``: causal and shared blocks, kernel and flash, over a
    pool of ``dtype`` (packed as ``quant``: the kernel's fp32 tiles then, flash over dequantized rows)."""
    need = max(SIZES) * 2 + MEMBERS * max(SIZES)
    pool = KVPool(need, 1, num_kv_heads, head_dim, dtype, quant=quant)
    every = torch.arange(need)
    pool.set_kv(0, every, torch.randn(need, num_kv_heads, head_dim), torch.randn(need, num_kv_heads, head_dim))
    heads = num_kv_heads * heads_per_kv
    out: dict[str, list[float]] = {k: [] for k in KINDS}
    dot = False
    if dtype == torch.bfloat16 and not quant and int(torch.ops.radixserve_cpu.attention_bf16_dot(1)) == 1:
        # the kernel's blocks with and without bf16 dot products: a prompt, and a decode step of
        # 2 * MEMBERS requests under one shared prefix
        blocks = (_batch(0, [SIZES[0]], pool), _batch(SIZES[0], [1] * (2 * MEMBERS), pool))
        out["dot"] = [sum(_time(pool, b, heads, DenseRule(0, 0, on)) for b in blocks) for on in (False, True)]
        dot = out["dot"][1] < out["dot"][0]
    for size in SIZES:
        causal = _batch(0, [size], pool)
        out["causal_kernel"].append(_time(pool, causal, heads, DenseRule(0, 0, dot)))
        out["causal_flash"].append(_time(pool, causal, heads, DenseRule(0, 1, dot)))
        shared = _batch(size, [size // MEMBERS] * MEMBERS, pool)
        out["shared_kernel"].append(_time(pool, shared, heads, DenseRule(0, 0, dot)))
        out["shared_flash"].append(_time(pool, shared, heads, DenseRule(1, 0, dot)))
    return out


def rule_from(timings: dict[str, list[float]], heads_per_kv: int) -> DenseRule:
    """Flash attention from the smallest timed size (in query rows per KV head) where it won."""
    def threshold(kind: str) -> int:
        for size, kernel, flash in zip(SIZES, timings[f"{kind}_kernel"], timings[f"{kind}_flash"]):
            if flash < kernel:
                return size * heads_per_kv
        return NEVER
    dot = timings.get("dot")
    return DenseRule(threshold("shared"), threshold("causal"), isinstance(dot, list) and len(dot) == 2 and dot[1] < dot[0])


def _problems(timings: dict[str, list[float]]) -> list[str]:
    """The kinds whose time falls with the block's size (``noise.outliers``)."""
    return [f"{k} at {o}" for k in KINDS for o in noise.outliers(dict(zip(SIZES, timings[k])))]


def _merge(a: dict[str, list[float]], b: dict[str, list[float]]) -> dict[str, list[float]]:
    return {k: [min(x, y) for x, y in zip(v, b.get(k, v))] for k, v in a.items()}


def _complete(timings: object) -> bool:
    return isinstance(timings, dict) and all(isinstance(timings.get(k), list) and len(timings[k]) == len(SIZES)
                                             for k in KINDS)


def dense_rule(kv_pool: KVPool, heads_per_kv: int,
               measure_fn: Optional[Callable[..., dict[str, list[float]]]] = None) -> DenseRule:
    """The measured rule for this machine and head layout (cached; a table still noisy after its
    retakes as provisional, ``noise.py``); the default rule where the measurement fails."""
    key = (f"{cpu_signature()} | torch {torch.__version__} | {torch.get_num_threads()} threads | "
           f"kernels {cpu_native.build_key()} | {kv_pool.dtype}{' ' + kv_pool.quant if kv_pool.quant else ''} | "
           f"kv heads {kv_pool.num_kv_heads} x "
           f"{heads_per_kv} | head dim {kv_pool.head_dim} | sizes {list(SIZES)}")
    path = os.path.join(loader.cache_root(), "attention_timings.json")
    cache = json_cache.load(path)
    timings = cache.get(key)
    provisional = cache.get(key + " | provisional")
    if _complete(timings) and not _problems(timings):
        stages.note("attention timing", "cached")
    elif _complete(provisional) and not noise.quiet_now(torch.get_num_threads()):
        timings = provisional
        stages.note("attention timing", "provisional (noisy when taken; retaken once the machine is quiet)")
    else:
        fn = measure_fn or measure
        kw = {"quant": kv_pool.quant} if kv_pool.quant else {}
        try:
            with stages.stage("attention timing", f"native kernel against flash attention at {list(SIZES)} tokens, "
                              "once per machine and head layout") as progress:
                take = lambda: fn(kv_pool.dtype, kv_pool.num_kv_heads, kv_pool.head_dim, heads_per_kv, **kw)  # noqa: E731
                timings, why, takes = noise.settle("attention timing", take, _problems, _merge,
                                                   torch.get_num_threads(), noise.Budget(RETAKE_BUDGET_S))
                progress.result(f"{takes} take{'s' if takes > 1 else ''}" + (", noisy: provisional" if why else ""))
        except Exception as e:  # a measurement must never stop the server
            logger.warning("attention timing failed (%s); the cpu backend keeps its default rule", e)
            return CpuBackend.default_rule(kv_pool)
        if why:
            logger.warning("attention timing still noisy after %d take%s (%s): cached as provisional, used while "
                           "the machine is busy and retaken by the first start that finds it quiet", takes,
                           "s" if takes > 1 else "", "; ".join(why))
            cache[key + " | provisional"] = timings
        else:
            cache[key] = timings
            cache.pop(key + " | provisional", None)
        json_cache.save(path, cache)
    rule = rule_from(timings, heads_per_kv)
    logger.info("cpu attention: flash attention for shared prefixes from %s and causal blocks from %s query rows "
                "per KV head; bf16 dot products %s | ms per layer at %s tokens: %s", _rows(rule.shared_min_rows),
                _rows(rule.causal_min_rows), "on" if rule.bf16_dot else "off", list(SIZES),
                "; ".join(f"{k} " + " ".join(f"{t * 1e3:.2f}" for t in v) for k, v in timings.items()))
    return rule


def _rows(n: int) -> str:
    return "never" if n >= NEVER else str(n)


def rule_for(heads_per_kv: int) -> Callable[[KVPool], DenseRule]:
    """``create_attention_backend``'s ``cpu_dense`` argument for a model with this GQA ratio."""
    return functools.partial(dense_rule, heads_per_kv=heads_per_kv)
