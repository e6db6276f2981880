"""The numerics a model runs with: its dtype and its quantization, from ModelConfig.

Explicit settings are taken as given: ``--dtype float32|bfloat16``, ``--quantization
none|int8|w8a8|int4`` (CPU only; an explicit method with ``--dtype auto`` computes in bf16,
the activation dtype its kernels are fast in).  ``--dtype float32 --quantization int4`` keeps
float32 arithmetic (``blocked_linear_exact``; exact where the weights are a Q4_1 GGUF's) and
is timed against the dense float32 kernel: int4 for calls up to the last probe M where it is
faster, the dense weights above.  Only the kernel of the dense layers is still
measured then: plain ``F.linear`` or oneDNN's prepacked weights (``model/quant/packed.py``),
the packed one by ``dense_kernel``'s rule.  ``--dense-kernel plain|packed`` pins that kernel
(nothing is timed for it, in ``auto`` too), for callers and tests that need one path whatever
this machine measures.  ``--quantization auto`` with an explicit dtype
means no quantization, and ``--dtype auto`` alone (``--quantization none``) is the faster of
fp32 and bf16 on the CPU, bf16 on CUDA.

With both ``auto`` on the CPU the choice comes from ``kernel_timing.py``'s table (time per
call, summed over the model's linear shapes, at each probe row count M):

1. Dense: each dtype runs its faster kernel (``dense_kernel``); then the faster
   of fp32 and bf16, summed over the Ms; a tie keeps fp32 (exact).
2. A quantized method (bf16 activations) counts as faster at an M when it takes at most
   ``1 - MARGIN`` of bf16's time there.  Where fp32 is the dense choice, int4 weights on
   float32 activations ("int4+float32", ``blocked_linear_exact``) compete the same way
   against it, as a hybrid with the fp32 weights (so the dense paths are timed first, and
   "int4+float32" only where fp32 won them).  On a bf16 model it runs for every call of up to
   ``max_m`` rows, the largest probe M before the first one where it is not faster, and the
   dense weights stay for larger calls (a hybrid; when it is faster at every M the dense
   weights are dropped).  On an fp32 model it competes only as a whole (bf16 throughout),
   by its summed time.
3. Candidates are ranked by summed time (ties keep the simpler: dense, then int8, w8a8,
   int4) and taken in that order, a quantized one only when its accuracy bar holds for this
   model (``quant_accuracy.py``: checked for the candidates that come before the dense one,
   once per model and method, then cached).  The walk ends at the dense choice at worst, so
   ``auto`` never picks the slower of the two exact paths nor an unverified quantization.

One log line gives the choice, every timing and the agreement rates it checked.
"""
from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from radixserve.config import DenseKernel, ModelConfig
from radixserve.model import loader
from radixserve.model.quant import blocked
from radixserve.model.quant import packed as packed_linear
from radixserve.model.quant.linear import METHODS
from radixserve.worker.tuning import quant_accuracy
from radixserve.worker.tuning.kernel_timing import COLD_MAX_M, DENSE, INT4_F32, PACKED, Timer, Timings, cache_key, \
    cold_copies, linear_shapes, measured_timings, packed_paths, stored_paths, time_path

logger = logging.getLogger(__name__)

MARGIN = 0.1  # a quantized kernel must save at least this share of the dense time to be used
LARGE_M_MARGIN = 0.15  # packed dense weights may cost at most this much more at prefill sizes (dense_kernel)
Verify = Callable[[str], tuple[float, int]]  # method -> (argmax agreement with fp32, positions)


@dataclass(frozen=True)
class Numerics:
    """``dtype`` of activations, KV pool and dense weights; ``quantization`` of the decoder's
    linear layers ("none" or a ``model/quant/linear.py`` method), its kernel used for calls of at
    most ``max_m`` rows (None: every call, no dense weights kept); ``packed``: dense weights
    (the LM head's included) on oneDNN's prepacked layout."""

    dtype: torch.dtype
    quantization: str = "none"
    max_m: Optional[int] = None
    packed: bool = False

    def quant_label(self) -> str:
        """"none", "int8", or "int8 at <= 4 rows" for a hybrid."""
        return self.quantization + ("" if self.max_m is None else f" at <= {self.max_m} rows")

    def describe(self) -> str:
        name = str(self.dtype).removeprefix("torch.") + (" (packed)" if self.packed else "")
        return name if self.quantization == "none" else f"{name} + {self.quant_label()}"


def resolve_dtype(name: str, device: torch.device) -> Optional[torch.dtype]:
    """An explicit dtype name, or None for "auto"."""
    if name == "auto":
        return None
    table = {"float32": torch.float32, "bfloat16": torch.bfloat16}  # ModelConfig.dtype's choices (config.py)
    if name not in table:
        raise ValueError(f"dtype: unknown dtype {name!r} (auto, float32, bfloat16)")
    return table[name]


def _total(per_m: dict[int, float]) -> float:
    return sum(per_m.values())


def dense_kernel(t: Timings, dtype: str, pin: DenseKernel = "auto") -> tuple[dict[int, float], bool]:
    """(per-M time, packed?) of ``dtype``'s dense kernel: ``pin`` ("plain" or "packed", the
    latter timed in ``t``) where it is not "auto".  Packing pays where oneDNN's per-call
    weight reorder dominates, at decode-sized M, and not at prefill sizes (measured 30% faster
    at M <= 64 on an AMX Xeon, within +-8% at M >= 256); so packed wins when it saves ``MARGIN``
    of the plain kernel's time summed over the Ms up to ``COLD_MAX_M`` and costs at most
    ``LARGE_M_MARGIN`` more at every larger M (prefill sizes, where both run the same GEMM and one
    hot timing on a busy 2-core VM moves by 10%: the choice flipped between two starts of one
    AMD EPYC on 44.7 against 49.3 ms at M = 1024, while packed saved 26% at decode sizes)."""
    packed, plain = t.get(dtype + PACKED), t[dtype]
    if packed is None or pin == "plain":
        return plain, False
    if pin == "packed":
        return packed, True
    small = [m for m in plain if m <= COLD_MAX_M] or list(plain)
    saves = sum(packed[m] for m in small) <= (1 - MARGIN) * sum(plain[m] for m in small)
    if saves and all(packed[m] <= (1 + LARGE_M_MARGIN) * plain[m] for m in plain if m not in small):
        return packed, True
    return plain, False


def dense_choice(t: Timings, pin: DenseKernel = "auto") -> str:
    """"bfloat16" where its kernel (``dense_kernel``) is faster than fp32's summed over the Ms;
    a tie keeps "float32" (exact)."""
    bf16, fp32 = (_total(dense_kernel(t, d, pin)[0]) for d in ("bfloat16", "float32"))
    return "bfloat16" if bf16 < fp32 else "float32"


def candidates(t: Timings, pin: DenseKernel = "auto") -> list[tuple[float, Numerics]]:
    """(summed time, numerics) of the dense choice and of each quantized path in ``t``, fastest
    first; ``pin`` as in ``dense_kernel``."""
    ms = sorted(t["float32"])
    kernels = {d: dense_kernel(t, d, pin) for d in DENSE}
    dense = dense_choice(t, pin)
    dense_t, bf16_packed = kernels[dense][0], kernels["bfloat16"][1]
    out = [(_total(dense_t), Numerics(getattr(torch, dense), packed=kernels[dense][1]))]
    for q in (p for p in METHODS if p in t):
        if dense == "bfloat16":
            wins = wins_up_to(t[q], dense_t, MARGIN)
            if not wins:
                continue
            max_m = None if wins == len(ms) else ms[wins - 1]
        elif _total(t[q]) <= (1 - MARGIN) * _total(dense_t):
            max_m = None
        else:
            continue
        score = sum(t[q][m] if max_m is None or m <= max_m else dense_t[m] for m in ms)
        out.append((score, Numerics(torch.bfloat16, q, max_m, bf16_packed)))
    if dense == "float32" and INT4_F32 in t:  # float32 arithmetic on int4 weights, at the Ms it is faster
        wins = wins_up_to(t[INT4_F32], dense_t, MARGIN)
        if wins:
            max_m = None if wins == len(ms) else ms[wins - 1]
            score = sum(t[INT4_F32][m] if max_m is None or m <= max_m else dense_t[m] for m in ms)
            out.append((score, Numerics(torch.float32, "int4", max_m, kernels["float32"][1])))
    order = ("none",) + METHODS
    return sorted(out, key=lambda c: (c[0], order.index(c[1].quantization), c[1].dtype == torch.float32))


def ceilings(t: Timings, paths: tuple[str, ...]) -> dict[str, dict[int, float]]:
    """Per quantized path, its time at each M past which no rule here reads its larger Ms: that
    of the slowest kernel (plain or packed) of the dense dtype it competes with, so that neither
    a pin nor a margin could still count it faster (``time_path`` stops timing there).  The
    bf16-activation methods get one only where bf16 is the dense choice under every pin; where
    fp32 is, they compete by their sum over every M.  (The caller passes dense tables that the
    cache holds, so a later start reads the same ones.)"""
    def slowest(dtype: str) -> dict[int, float]:
        return {m: max(t[p][m] for p in (dtype, dtype + PACKED) if p in t) for m in t[dtype]}

    out = {INT4_F32: slowest("float32")} if INT4_F32 in paths else {}
    if all(dense_choice(t, pin) == "bfloat16" for pin in ("auto", "plain", "packed")):
        out.update({p: slowest("bfloat16") for p in paths if p in METHODS})
    return out


def method_key(n: Numerics) -> str:
    """The accuracy check's name of a quantized candidate: its method, "int4+float32" for int4
    on float32 activations (``quant_accuracy`` loads each as it serves)."""
    return INT4_F32 if n.quantization == "int4" and n.dtype == torch.float32 else n.quantization


def choose(t: Timings, verify: Verify, pin: DenseKernel = "auto") -> tuple[Numerics, dict[str, tuple[float, int]]]:
    """The first candidate whose accuracy holds, and what ``verify`` returned for the methods checked."""
    rates: dict[str, tuple[float, int]] = {}
    for _, c in candidates(t, pin):
        if c.quantization == "none":
            return c, rates
        key = method_key(c)
        rates[key] = verify(key)
        if quant_accuracy.passes(*rates[key]):
            return c, rates
    raise AssertionError("the dense candidate is always in the list")  # pragma: no cover


def wins_up_to(fast: dict[int, float], slow: dict[int, float], margin: float = 0.0) -> int:
    """How many of the probe Ms, from the smallest, ``fast`` takes at most ``1 - margin`` of
    ``slow``'s time at."""
    ms = sorted(slow)
    wins = 0
    while wins < len(ms) and fast[ms[wins]] <= (1 - margin) * slow[ms[wins]]:
        wins += 1
    return wins


def _int4_float32(shapes: Any, pin: DenseKernel, cache_path: str, timer: Timer, copies: int) -> Numerics:
    """``--dtype float32 --quantization int4`` where the exact kernel builds: float32 arithmetic
    on int4 weights (``blocked_linear_exact``) for the calls of up to the largest probe M before
    the first one where it is slower than the dense float32 kernel, the dense weights for larger
    calls (where none is faster: int4 throughout, as asked)."""
    paths = ("float32",) + (() if pin == "plain" else packed_paths(("float32",))) + (INT4_F32,)
    timings, cached = measured_timings(shapes, paths, cache_path, timer, copies=copies)
    dense_t, packed = dense_kernel(timings, "float32", pin)
    ms = sorted(dense_t)
    wins = wins_up_to(timings[INT4_F32], dense_t)
    choice = Numerics(torch.float32, "int4", None if wins in (0, len(ms)) else ms[wins - 1], packed)
    logger.info("numerics: %s | us per call (sum over %d shapes) by M: %s | %s timings", choice.describe(),
                len(shapes), "; ".join(f"{p} {_row(timings[p])}" for p in paths), "cached" if cached else "measured")
    return choice


def _row(per_m: dict[int, float]) -> str:
    """"1:587 2:1350 ..." in microseconds; "-" for an M not timed (``kernel_timing.CUT``)."""
    return " ".join(f"{m}:{'-' if t == float('inf') else f'{t * 1e6:.0f}'}" for m, t in sorted(per_m.items()))


def resolve_numerics(cfg: ModelConfig, device: torch.device, config: Any, hf_dir: str,
                     timer: Timer = time_path, verify: Optional[Verify] = None) -> Numerics:
    """``cfg.dtype``, ``cfg.quantization`` and ``cfg.dense_kernel`` made concrete for this device
    and model (see the module docstring); ``auto`` measures on the first start and reads the
    caches afterwards.  A pinned ``dense_kernel`` is never timed."""
    dtype, q, pin = resolve_dtype(cfg.dtype, device), cfg.quantization, cfg.dense_kernel
    if device.type != "cpu":
        if q not in ("auto", "none"):
            raise ValueError(f"quantization: {q} is implemented for the CPU only (use none or auto)")
        if pin == "packed":
            raise ValueError("dense_kernel: packed is implemented for the CPU only (use plain or auto)")
        return Numerics(dtype or torch.bfloat16)
    lacking = [d for d in ([dtype] if dtype else [torch.float32, torch.bfloat16])
               if pin == "packed" and not packed_linear.available(d)]
    if lacking:
        raise ValueError(f"dense_kernel: this torch build has no oneDNN packed linear for {lacking[0]} "
                         "(use plain or auto)")
    shapes = linear_shapes(config)
    copies = cold_copies(shapes, int(getattr(config, "num_hidden_layers", 1)))  # the model's footprint
    if timer is time_path:
        timer = functools.partial(time_path, copies=copies)
    cache_path = os.path.join(loader.cache_root(), "kernel_timings.json")
    if q == "int4" and dtype == torch.float32 and all(blocked.exact_available(n, k) for k, n in shapes):
        return _int4_float32(shapes, pin, cache_path, timer, copies)
    if q in METHODS or dtype is not None:  # explicit numerics: only the dense kernel is measured
        dense = dtype or torch.bfloat16
        name = str(dense).removeprefix("torch.")
        packed = pin == "packed"
        if pin == "auto" and name in DENSE and packed_paths((name,)):
            timings, _ = measured_timings(shapes, (name, name + PACKED), cache_path, timer, copies=copies)
            packed = dense_kernel(timings, name)[1]
        return Numerics(dense, q if q in METHODS else "none", packed=packed)
    # the dense paths first: the dense choice decides which quantized ones can matter
    paths = DENSE + (() if pin == "plain" else packed_paths())
    timings, cached = measured_timings(shapes, paths, cache_path, timer, copies=copies)
    more = () if q == "none" else METHODS
    if q == "auto" and dense_choice(timings, pin) == "float32" and all(blocked.exact_available(n, k)
                                                                       for k, n in shapes):
        more += (INT4_F32,)  # (only an fp32 dense choice has it compete: ``candidates``)
    if more:
        clean = set(paths) <= stored_paths(shapes, cache_path, copies=copies)  # (every dense path timed and kept)
        quantized, more_cached = measured_timings(shapes, more, cache_path, timer, copies=copies,
                                                  ceilings=ceilings(timings, more) if clean and pin == "auto" else None)
        timings, cached, paths = {**timings, **quantized}, cached and more_cached, paths + more
    if verify is None:
        acc_path = os.path.join(loader.cache_root(), "quant_accuracy.json")
        verify = lambda method: quant_accuracy.verified_agreement(hf_dir, config, method, acc_path)  # noqa: E731
    choice, rates = choose(timings, verify, pin)
    table = "; ".join(f"{p} {_row(timings[p])}" for p in paths)
    checked = ", ".join(f"{m} {r:.4f} over {n} (lower bound {quant_accuracy.lower_bound(r, n):.4f})"
                        for m, (r, n) in rates.items()) or "none needed"
    logger.info("numerics auto: %s | us per call (sum over %d shapes) by M: %s | argmax agreement with fp32, "
                "bar %.2f: %s | %s timings, %s", choice.describe(), len(shapes), table, quant_accuracy.BAR, checked,
                "cached" if cached else "measured", cache_key(shapes, copies=copies))
    return choice
