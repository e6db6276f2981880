"""``dtype="auto"`` on the CPU: fp32 or bf16, whichever is faster here, chosen by measurement.

A CPU-flag table cannot choose well.  bf16 matmuls ran at about half the fp32 rate on an
Intel Xeon with AVX512-BF16 but no AMX (oneDNN has no fast bf16 kernel there), about 5x
slower than fp32 on an AVX2-only EPYC, and faster than fp32 with AMX.  So the first start on
a machine times torch's matmul in both dtypes on the model's own MLP shapes, at a batched
decode-like M and a prefill-like M, and picks the dtype with the smaller total; a tie keeps
fp32, the exact path.  Both are exact enough to serve (bf16's agreement with HF fp32 is
tested).  The result is cached in ``$RADIXSERVE_CACHE/dtype_choice.json`` per (CPU model and
flags, torch version, thread count, shapes), and one log line gives the choice and timings.
``--dtype float32|bfloat16`` skips all of this.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import time
from typing import Any, Callable, Optional

import torch

logger = logging.getLogger(__name__)

PROBE_M = (64, 1024)  # batched decode, prefill chunk
CANDIDATES = (torch.float32, torch.bfloat16)
Shapes = tuple[tuple[int, int], ...]  # (in_features, out_features) of the timed linear layers


def mlp_shapes(config: Any) -> Shapes:
    """The linear layers that dominate a step: the MLP's up/gate and down projections."""
    return ((config.hidden_size, config.intermediate_size), (config.intermediate_size, config.hidden_size))


def cpu_signature() -> str:
    """CPU model name and a hash of its flags (from /proc/cpuinfo; the platform where absent)."""
    info: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    model = info.get("model name") or platform.processor() or platform.machine()
    flags = " ".join(sorted(info.get("flags", "").split()))
    return f"{model} | flags {hashlib.sha1(flags.encode()).hexdigest()[:12]}"


def cache_key(shapes: Shapes) -> str:
    return f"{cpu_signature()} | torch {torch.__version__} | {torch.get_num_threads()} threads | {list(shapes)}"


def time_matmuls(dtype: torch.dtype, shapes: Shapes, ms: tuple[int, ...] = PROBE_M, reps: int = 3) -> float:
    """Best-of-``reps`` seconds for one ``x @ w`` per (shape, M), summed."""
    total = 0.0
    gen = torch.Generator().manual_seed(0)
    for k, n in shapes:
        w = torch.randn(k, n, generator=gen).to(dtype)
        for m in ms:
            x = torch.randn(m, k, generator=gen).to(dtype)
            x @ w  # warm-up: oneDNN builds its kernel on the first call
            best = float("inf")
            for _ in range(reps):
                t = time.perf_counter()
                x @ w
                best = min(best, time.perf_counter() - t)
            total += best
    return total


def pick(timings: dict[str, float]) -> torch.dtype:
    """The faster dtype; fp32 unless bf16 is strictly faster."""
    return torch.bfloat16 if timings["bfloat16"] < timings["float32"] else torch.float32


def _load(path: str) -> dict:
    try:
        with open(path) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def choose_cpu_dtype(shapes: Shapes, cache_path: Optional[str],
                     timer: Callable[[torch.dtype, Shapes], float] = time_matmuls) -> torch.dtype:
    """fp32 or bf16 for these shapes on this CPU: from the cache, else measured (and cached)."""
    key = cache_key(shapes)
    cache = _load(cache_path) if cache_path else {}
    entry = cache.get(key)
    if isinstance(entry, dict) and entry.get("choice") in ("float32", "bfloat16") and "timings" in entry:
        logger.info("dtype auto: %s (cached measurement: %s)", entry["choice"], _fmt(entry["timings"]))
        return getattr(torch, entry["choice"])
    timings = {str(dt).removeprefix("torch."): timer(dt, shapes) for dt in CANDIDATES}
    choice = pick(timings)
    name = str(choice).removeprefix("torch.")
    logger.info("dtype auto: %s (measured %s; %s)", name, _fmt(timings), key)
    if cache_path:
        cache[key] = {"choice": name, "timings": timings, "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}
        try:
            os.makedirs(os.path.dirname(cache_path), exist_ok=True)
            tmp = f"{cache_path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                json.dump(cache, f, indent=1)
            os.replace(tmp, cache_path)
        except OSError as e:  # a read-only home: measure again next time
            logger.warning("dtype auto: could not cache the measurement in %s: %s", cache_path, e)
    return choice


def _fmt(timings: dict[str, float]) -> str:
    return ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in sorted(timings.items()))
