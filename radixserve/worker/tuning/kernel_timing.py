"""How fast each linear-layer path runs on this CPU, measured once per machine and cached.

A CPU-flag table cannot choose well.  bf16 matmuls ran at about half the fp32 rate on an
Intel Xeon with AVX512-BF16 but no AMX (oneDNN has no fast bf16 kernel there), about 5x
slower than fp32 on an AVX2-only EPYC, and faster than fp32 with AMX; torch's int8/int4
weight kernels beat both only at a handful of rows.  So the first start on a machine times
every path on the model's own linear shapes (qkv, o, gate_up, down) at decode-like and
prefill-like row counts M (``PROBE_M``) and caches the table in
``$RADIXSERVE_CACHE/kernel_timings.json`` per (CPU model and flags, torch version, thread
count, shapes, Ms).  ``numerics_choice.py`` chooses from it.  A table that is plainly noisy is
retaken, and never cached as a clean one (``noise.py``: the rule, the retakes, the quick pass once
the machine stays busy, and provisional tables, used while the machine is busy and retaken once it
is quiet).  A path given a ``ceiling`` (``numerics_choice.ceilings``) is not timed past
the first M where it is confirmed slower than it: those Ms read as ``CUT`` (null in the file).

Paths: "float32" and "bfloat16" (``F.linear`` in that dtype), "float32+packed" and
"bfloat16+packed" (the same on oneDNN's prepacked weights, ``model/quant/packed.py``, where
torch has it), and "int8", "w8a8", "int4"
(``model/quant/linear.py``'s QuantLinear) on bf16 activations, the only dtype their kernels are fast
in: measured on an AMX Xeon, int8 weights with fp32 activations ran 10x and int4 28x slower
than with bf16 ones, so fp32 activations are not timed for them (a first start would pay
seconds).  The exception is "int4+float32": int4 weights on ``blocked_linear_exact``, float32
arithmetic throughout, timed for ``--dtype float32 --quantization int4`` (``numerics_choice``).
"""
from __future__ import annotations

import hashlib
import inspect
import logging
import platform
import time
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F

from radixserve.kernels import cpu_native
from radixserve.model.quant import packed as packed_linear
from radixserve.model.quant.packed import PackedLinear
from radixserve.model.quant.linear import FORMAT_VERSION, METHODS, QuantLinear, supports
from radixserve.proc import stages
from radixserve.worker.tuning import json_cache, noise

logger = logging.getLogger(__name__)

PROBE_M = (1, 2, 4, 8, 16, 64, 256, 1024)  # decode batches ... prefill chunks
COLD_MAX_M = 64  # up to here weights are timed cold (see time_path)
COLD_BYTES = 1 << 30  # fp32 bytes of weight copies a cold pass may allocate
MAX_COPIES = 64
RETAKE_BUDGET_S = 15.0  # seconds that retakes of noisy paths may add to one measurement (noise.py)
HOT_REPS = 10  # best of this many calls per shape above COLD_MAX_M (a call takes < 1 ms there)
DENSE = ("float32", "bfloat16")
PATHS = DENSE + METHODS
PACKED = "+packed"  # suffix of a dense path on prepacked weights
INT4_F32 = "int4+float32"  # int4 weights, float32 activations (blocked_linear_exact: float32 arithmetic)
Shapes = tuple[tuple[int, int], ...]  # (in_features, out_features) of the timed linear layers
Timings = dict[str, dict[int, float]]  # path -> M -> seconds for one call per shape, summed
Timer = Callable[..., dict[int, float]]  # (path, shapes, Ms[, ceiling=...]): time_path's signature
CUT = float("inf")  # the time of an M not timed: the path lost to its ceiling at a smaller M


def packed_paths(dtypes: tuple[str, ...] = DENSE) -> tuple[str, ...]:
    """The packed variants of ``dtypes`` this torch build can run."""
    return tuple(d + PACKED for d in dtypes if packed_linear.available(getattr(torch, d)))


def linear_shapes(config: Any) -> Shapes:
    """The decoder layer's linear layers: fused qkv, o, fused gate/up, down."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    q, kv = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim
    h, i = config.hidden_size, config.intermediate_size
    return ((h, q + 2 * kv), (q, h), (h, 2 * i), (i, h))


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


def cache_key(shapes: Shapes, ms: tuple[int, ...] = PROBE_M, copies: Optional[int] = None) -> str:
    kernels = f"native kernels v{FORMAT_VERSION} build {cpu_native.build_key()}" if cpu_native.load() else "torch kernels"
    return (f"{cpu_signature()} | torch {torch.__version__} | {torch.get_num_threads()} threads | "
            f"{list(shapes)} | M {list(ms)} | cold to M {COLD_MAX_M} over {copies or cold_copies(shapes)} copies | "
            f"{kernels} | dense plain and packed, hot best of {HOT_REPS}, warm-up on one copy")


def _layer(path: str, w: torch.Tensor) -> tuple[Callable[[torch.Tensor], torch.Tensor], torch.dtype]:
    if path.endswith(PACKED):
        dtype = getattr(torch, path.removesuffix(PACKED))
        return PackedLinear(w.to(dtype), None), dtype
    if path in DENSE:
        dtype = getattr(torch, path)
        wd = w.to(dtype)
        return (lambda x: F.linear(x, wd)), dtype
    if path == INT4_F32:
        return QuantLinear(w, None, "int4", torch.float32), torch.float32
    if not supports(path, *w.shape):  # the model keeps such a layer dense: time it so
        wd = w.to(torch.bfloat16)
        return (lambda x: F.linear(x, wd)), torch.bfloat16
    return QuantLinear(w, None, path, torch.bfloat16), torch.bfloat16


def cold_copies(shapes: Shapes, num_layers: int = MAX_COPIES) -> int:
    """How many distinct copies of the layer's weights a cold pass cycles through: one per
    decoder layer of the model, so that each format's pass moves as many bytes as the model's
    forward does (fewer copies let int8 weights stay in the L3 cache when the model's do not,
    and made int8 look faster than int4 at one row while it ran 15% slower end to end);
    at most ``COLD_BYTES`` of fp32 copies."""
    per_copy = 4 * sum(k * n for k, n in shapes)  # fp32 bytes, the largest format
    return max(1, min(num_layers, MAX_COPIES, COLD_BYTES // per_copy))


def best_time(fn: Callable[[], Any], reps: int, warm_up: Optional[Callable[[], Any]] = None) -> float:
    """Seconds of the fastest of ``reps`` calls, after one warm-up call (of ``warm_up`` if given)."""
    (warm_up or fn)()  # oneDNN builds its kernel on the first call
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def time_path(path: str, shapes: Shapes, ms: tuple[int, ...] = PROBE_M, reps: int = 3,
              copies: Optional[int] = None, ceiling: Optional[dict[int, float]] = None,
              quick: bool = False) -> dict[int, float]:
    """Seconds for one call of ``path`` per shape, summed (a decoder layer), for each M; with a
    ``ceiling``, the Ms after the first one whose time exceeds it there are not timed (``CUT``);
    ``quick``: one pass per M (two hot calls per shape), for a table that will not be cached.

    Up to ``COLD_MAX_M`` rows the weights are cold, as in a model's forward: a pass calls every
    shape of ``copies`` distinct weight copies (default ``cold_copies(shapes)``), and the best
    of ``reps`` passes is divided by the copies.  Timing one hot weight instead (it stays in the L2/L3
    cache) made decode look 2-3x cheaper for bf16 than it is.  Larger M are compute-bound:
    one copy, best of ``max(reps, HOT_REPS)`` calls per shape."""
    gen = torch.Generator().manual_seed(0)
    copies = copies or cold_copies(shapes)
    out: dict[int, float] = {}
    with torch.inference_mode():
        base = [torch.randn(n, k, generator=gen) * 0.05 for k, n in shapes]
        layers = [[_layer(path, w) for w in base] for _ in range(copies)]
        xs = {m: [torch.randn(m, k, generator=gen).to(dtype) for (k, _), (_, dtype) in zip(shapes, layers[0])]
              for m in ms}

        def run(m: int, few: list) -> None:
            for layer in few:
                for (fn, _), x in zip(layer, xs[m]):
                    fn(x)

        cold_reps, hot_reps = (1, 2) if quick else (reps, max(reps, HOT_REPS))

        def measure(m: int) -> float:
            if m <= COLD_MAX_M:  # (warmed up on one copy: the kernels are per shape, not per copy)
                return best_time(lambda: run(m, layers), cold_reps, lambda: run(m, layers[:1])) / copies
            return sum(best_time(lambda fn=fn, x=x: fn(x), hot_reps) for (fn, _), x in zip(layers[0], xs[m]))

        lost = False
        for m in ms:
            out[m] = CUT if lost else measure(m)
            if not lost and ceiling is not None and out[m] > ceiling.get(m, CUT):
                out[m] = min(out[m], measure(m))  # a loss is confirmed by a second timing before it cuts
                lost = out[m] > ceiling.get(m, CUT)
    return out


def _complete(entry: Any, ms: tuple[int, ...]) -> bool:
    return isinstance(entry, dict) and all(isinstance(entry.get(str(m)), (int, float, type(None))) for m in ms)


def _valid(entry: Any, ms: tuple[int, ...]) -> bool:
    """A complete cached table (null: ``CUT``) that is not plainly noisy (one cached before the
    rule is measured again) nor provisional."""
    return _complete(entry, ms) and "noisy" not in entry and not noise.outliers(_read(entry, ms))


def _provisional(entry: Any, ms: tuple[int, ...]) -> bool:
    """A complete table cached as still noisy after its retakes (``"noisy"``: why)."""
    return _complete(entry, ms) and isinstance(entry.get("noisy"), str)


def stored_paths(shapes: Shapes, cache_path: Optional[str], ms: tuple[int, ...] = PROBE_M,
                 copies: Optional[int] = None) -> set[str]:
    """The paths whose clean tables the cache holds for these shapes (not the provisional ones)."""
    entry = json_cache.load(cache_path).get(cache_key(shapes, ms, copies))
    timings = entry.get("timings") if isinstance(entry, dict) else None
    return {p for p, e in timings.items() if _valid(e, ms)} if isinstance(timings, dict) else set()


def _read(entry: dict, ms: tuple[int, ...]) -> dict[int, float]:
    return {m: CUT if entry[str(m)] is None else float(entry[str(m)]) for m in ms}


def measured_timings(shapes: Shapes, paths: tuple[str, ...], cache_path: Optional[str],
                     timer: Timer = time_path, ms: tuple[int, ...] = PROBE_M, copies: Optional[int] = None,
                     ceilings: Optional[dict[str, dict[int, float]]] = None) -> tuple[Timings, bool]:
    """(timings of ``paths`` on these shapes, whether all came from the cache).  Paths missing
    from the cache are measured with ``timer`` (given a path's ``ceilings``, if any: ``time_path``),
    retaken while plainly noisy (``noise.py``), and added to the cache unless still noisy; a
    cache that cannot be read or written never fails the caller."""
    key = cache_key(shapes, ms, copies)
    cache = json_cache.load(cache_path)
    entry = cache.get(key) if isinstance(cache.get(key), dict) else {}
    stored = entry.get("timings") if isinstance(entry.get("timings"), dict) else {}
    missing = [p for p in paths if not _valid(stored.get(p), ms)]
    provisional = [p for p in missing if _provisional(stored.get(p), ms)]
    if provisional and not noise.quiet_now(torch.get_num_threads()):
        logger.info("kernel timing: using the provisional tables of %s (noisy when taken); the machine is busy now, "
                    "so a later start on a quiet one retakes them", ", ".join(provisional))
        missing = [p for p in missing if p not in provisional]
    if not missing:
        stages.note("numerics timing", f"cached ({len(paths)} paths, {cache_path})")
        return {p: _read(stored[p], ms) for p in paths}, True
    fresh: Timings = {}
    noisy: dict[str, tuple[list[str], int]] = {}
    params = inspect.signature(timer).parameters  # (a test's timer may take neither ceiling nor quick)
    budget = noise.Budget(RETAKE_BUDGET_S)
    with stages.stage("numerics timing", f"{len(missing)} paths on {len(shapes)} linear shapes at {len(ms)} row "
                      "counts, once per machine", total=len(missing), unit="paths") as progress:
        for p in missing:
            progress.working_on(p)
            extra = {"ceiling": ceilings[p]} if ceilings and p in ceilings and "ceiling" in params else {}
            if noise.machine_busy() and "quick" in params:
                extra["quick"] = True  # a busy machine: this table is not cached, time it once over
            per_m, why, takes = noise.settle(f"kernel timing of {p}", lambda p=p: timer(p, shapes, ms, **extra),
                                             noise.outliers, noise.merge_min, torch.get_num_threads(), budget)
            fresh[p] = per_m
            stored[p] = {str(m): None if s == CUT else float(s) for m, s in per_m.items()}
            if why:  # kept as provisional: used while the machine stays busy, retaken once it is quiet
                noisy[p] = why, takes
                stored[p]["noisy"] = "; ".join(why)
            progress.step(p + (f" after {takes} takes" if takes > 1 else ""))
        progress.result("measured, cached" + (f"; provisional (noisy): {', '.join(noisy)}" if noisy else ""))
    for p, (why, takes) in noisy.items():
        logger.warning("kernel timing of %s still noisy after %d take%s (%s): cached as provisional, used while "
                       "the machine is busy and retaken by the first start that finds it quiet", p, takes,
                       "s" if takes > 1 else "", "; ".join(why))
    cache[key] = {"timings": stored, "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    json_cache.save(cache_path, cache)
    return {p: fresh[p] if p in fresh else _read(stored[p], ms) for p in paths}, False
