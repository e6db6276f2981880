"""Which LoRA path a step's row count takes on this CPU, measured once per machine and cached.

The native segmented kernel (SGMV, ``kernels/cpu/lora_sgmv.cpp``) reads each slot's A and B once
per block of 8 rows and does its products in fp32 vector code; the stacked GEMMs (``step.py``) do
a few times the arithmetic through torch's GEMM (oneDNN: AMX or AVX-512 BF16 where the CPU has
them).  Which is faster depends on the machine and the row count: on an AMD Zen 4 without AMX the
kernel was 2-3x faster from 8 to 512 rows; on an Intel Xeon with AMX it was faster up to 128 rows
and 2.5-3.5x slower at 4096.  A flag table cannot say where the crossover lies, so the first start
with LoRA times both paths on the slots' own shapes (one layer's target modules, every slot in
use, rows spread over the slots) at ``PROBE_M`` rows and caches the times in
``$RADIXSERVE_CACHE/lora_timings.json`` per (CPU, torch, threads, shapes, dtype, rank, slots).

``sgmv_limit(timings)``: the row count from which the stacked GEMMs are used (rows below it take
the kernel); ``measured_limit(slots, path)`` measures or reads it.
"""
from __future__ import annotations

import math
import sys
import time
from typing import Optional

import torch

from radixserve.worker.lora.slots import LoRASlots
from radixserve.worker.tuning import json_cache
from radixserve.worker.tuning.kernel_timing import best_time, cpu_signature

PROBE_M = (16, 64, 256, 1024, 4096)
REPS = 5
NO_LIMIT = sys.maxsize  # the kernel at every row count
Timings = dict[str, dict[int, float]]  # "sgmv" / "gemm" -> rows -> seconds for one layer's modules


def time_paths(slots: LoRASlots, ms: tuple[int, ...] = PROBE_M, reps: int = REPS) -> Timings:
    """Seconds for one layer's target modules at each row count in ``ms``, on both paths."""
    from radixserve.worker.lora.step import LoRAStep

    out: Timings = {"sgmv": {}, "gemm": {}}
    for m in ms:
        row_slot = torch.arange(m, device=slots.device) % slots.num_slots
        ios = [(mod, torch.randn(m, slots.geometry[mod][0], dtype=slots.dtype, device=slots.device),
                torch.zeros(m, sum(slots.geometry[mod][1]), dtype=slots.dtype, device=slots.device))
               for mod in slots.modules]
        for path, sgmv in (("sgmv", True), ("gemm", False)):
            step = LoRAStep(slots, row_slot, sgmv)

            def run(step: LoRAStep = step) -> None:
                for mod, x, y in ios:
                    step.add(0, mod, x, y)

            out[path][m] = best_time(run, reps)
    return out


def sgmv_limit(timings: Timings) -> int:
    """The smallest row count from which the stacked GEMMs stay faster at every larger probe (the
    geometric middle between that probe and the one below it), or ``NO_LIMIT``."""
    ms = sorted(timings["sgmv"])
    first: Optional[int] = None
    for i, m in enumerate(ms):
        if timings["gemm"][m] < timings["sgmv"][m]:
            if first is None:
                first = i
        else:
            first = None
    if first is None:
        return NO_LIMIT
    if first == 0:
        return 1
    return int(math.sqrt(ms[first - 1] * ms[first])) + 1


def cache_key(slots: LoRASlots, ms: tuple[int, ...]) -> str:
    from radixserve.kernels import cpu_native

    shapes = [(m, slots.geometry[m]) for m in slots.modules]
    return (f"{cpu_signature()} | torch {torch.__version__} | {torch.get_num_threads()} threads | "
            f"native build {cpu_native.build_key()} | {shapes} | {slots.dtype} | rank {slots.rank} | "
            f"{slots.num_slots} slots | M {list(ms)} | best of {REPS}")


def measured_limit(slots: LoRASlots, cache_path: Optional[str], ms: tuple[int, ...] = PROBE_M) -> int:
    """``sgmv_limit`` of this machine's timings (read from ``cache_path`` or measured and stored)."""
    key = cache_key(slots, ms)
    cache = json_cache.load(cache_path)
    entry = cache.get(key)
    try:
        timings = {p: {int(m): float(s) for m, s in entry["timings"][p].items()} for p in ("sgmv", "gemm")}
        if sorted(timings["sgmv"]) != sorted(ms) or sorted(timings["gemm"]) != sorted(ms):
            raise ValueError
    except (TypeError, KeyError, ValueError, AttributeError):
        timings = time_paths(slots, ms)
        cache[key] = {"timings": {p: {str(m): s for m, s in t.items()} for p, t in timings.items()},
                      "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}
        json_cache.save(cache_path, cache)
    return sgmv_limit(timings)
