"""Does a quantization method keep this model accurate?  Measured once per model, then cached.

The bar (``BAR``): teacher-forced next-token argmax agreement of at least 97% with the same
model in fp32.  How ``auto`` knows it holds: the CHECK texts of ``model/quant/calibration.py`` (a
chat turn, prose, code, a how-to, a dialogue; ~600 tokens with SmolLM2's tokenizer, none of
them the FIT texts the method's input scales were searched on) run through the model twice as
one extend step: in fp32 (the reference; our fp32 path matches HF transformers within 1e-4)
and with the method's kernel on every row (bf16 activations, as the method serves; float32
ones for "int4+float32").  The
agreement is the share of positions whose argmax is the same, and the bar holds when the
lower end of its one-sided 95% Wilson interval is at least ``BAR``: a method measured at
97.2% over 600 positions is not taken (it could well be below 97% on other text).  The
hybrid of ``numerics_choice.py`` runs, at every row, either this verified kernel or the exact
dense path.  The acceptance test (tests/core/test_smollm2.py) measures the same rate against HF on
other prompts.

Cost, paid on the first start per (model, method) and only for methods that would win on
speed: one fp32 load and forward (shared by the methods checked in one start) and one
quantized load (with the input-scale search on its first load) and forward per method; a few
seconds for SmolLM2-135M on 2 cores.  Cached in ``$RADIXSERVE_CACHE/quant_accuracy.json`` per
(model fingerprint, method, calibration version, torch version).
"""
from __future__ import annotations

import logging
import math
import time
from typing import Any, Callable, Optional

import torch

from radixserve.model import loader
from radixserve.model.quant import calibration, linear as quant
from radixserve.proc import stages
from radixserve.worker.tuning import json_cache

logger = logging.getLogger(__name__)

BAR = 0.97
Z = 1.645  # one-sided 95%
_REFERENCE: dict[str, torch.Tensor] = {}  # hf_dir -> fp32 argmax, shared by the methods checked in one start


def lower_bound(rate: float, n: int, z: float = Z) -> float:
    """The lower end of the Wilson score interval of a rate measured over ``n`` positions."""
    if n <= 0:
        return 0.0
    centre = rate + z * z / (2 * n)
    spread = z * math.sqrt(rate * (1 - rate) / n + z * z / (4 * n * n))
    return (centre - spread) / (1 + z * z / n)


def passes(rate: float, n: int) -> bool:
    return lower_bound(rate, n) >= BAR


def measure_agreement(hf_dir: str, config: Any, method: str) -> tuple[float, int]:
    """(agreement of ``method`` with fp32 on the CHECK texts, number of positions)."""
    cpu = torch.device("cpu")
    seqs = calibration.encode(hf_dir, calibration.CHECK)
    max_pos = max(len(s) for s in seqs) + 1
    progress = stages.current()
    if hf_dir not in _REFERENCE:
        _REFERENCE.clear()
        progress.working_on("the fp32 reference")
        ref_model = loader.load_model(config, hf_dir, torch.float32, cpu, max_pos)
        _REFERENCE[hf_dir] = calibration.teacher_forced_logits(ref_model, seqs).argmax(-1)
    # "int4+float32" (numerics_choice.method_key): int4 weights on float32 activations
    dtype, quantization = (torch.float32, "int4") if method == "int4+float32" else (torch.bfloat16, method)
    progress.working_on(f"loading {method}")
    model = loader.load_model(config, hf_dir, dtype, cpu, max_pos, quantization=quantization)
    progress.working_on(f"{method}'s forward")
    got = calibration.teacher_forced_logits(model, seqs).argmax(-1)
    return float((got == _REFERENCE[hf_dir]).float().mean()), int(got.numel())


def verified_agreement(hf_dir: str, config: Any, method: str, cache_path: Optional[str],
                       measure: Callable[[str, Any, str], tuple[float, int]] = measure_agreement) -> tuple[float, int]:
    """(``method``'s agreement rate for this model, positions): cached, else measured and cached."""
    key = (f"{calibration.model_fingerprint(hf_dir)} | {method} v{quant.FORMAT_VERSION} | "
           f"calibration v{calibration.CALIBRATION_VERSION} | "
           f"torch {torch.__version__}")
    cache = json_cache.load(cache_path)
    entry = cache.get(key)
    if isinstance(entry, dict) and isinstance(entry.get("agreement"), (int, float)) \
            and isinstance(entry.get("positions"), int):
        return float(entry["agreement"]), entry["positions"]
    t0 = time.perf_counter()
    with stages.stage("accuracy check", f"{method} against fp32 on the calibration check texts, once per model "
                      "and method") as progress:
        rate, positions = measure(hf_dir, config, method)
        progress.result(f"{method}: agreement {rate:.4f} over {positions} positions, "
                        f"{'passes' if passes(rate, positions) else 'misses'} the {BAR:.0%} bar")
    logger.info("quantization %s: teacher-forced argmax agreement with fp32 %.4f over %d positions (%.1f s)",
                method, rate, positions, time.perf_counter() - t0)
    cache[key] = {"agreement": rate, "positions": positions, "model": hf_dir,
                  "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    json_cache.save(cache_path, cache)
    return rate, positions
