"""Does a lossy KV pool form (``--kv-cache-dtype``) keep this model accurate?  Measured per model.

The bar is the weights' (``quant_accuracy.BAR``): teacher-forced next-token argmax agreement of at
least 97% at the lower end of the one-sided 95% Wilson interval, here between the model with its
exact pool (its own dtype) and the same model with the pool in the asked form, on the CHECK texts
of ``model/quant/calibration.py`` (1,327 positions with SmolLM2's tokenizer) run as one extend step: the
attention reads every token's K/V back from the pool, so the step sees the whole loss.  A form
that misses the bar is refused at startup with the measured numbers, naming the forms that pass:
the same form may hold for one model and not for another (SmolLM2-135M: int8 98.4-98.9%,
fp8_e4m3 96.5-97.2%, fp8_e5m2 92.8-93.9%; ``benchmarks/bench_kv_cache_dtype.py`` measures it on
ShareGPT text as well).

Cost: two forwards of the CHECK texts with the loaded model (no second load), ~2 s for
SmolLM2-135M on 2 cores, paid once per (model, model dtype, form, calibration version, torch
version): cached in ``$RADIXSERVE_CACHE/kv_accuracy.json``.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any, Optional

import torch

from radixserve.config import CacheConfig
from radixserve.mem_cache import kv_quant
from radixserve.model import loader
from radixserve.model.quant import calibration
from radixserve.proc import stages
from radixserve.worker.tuning import json_cache
from radixserve.worker.tuning.quant_accuracy import BAR, lower_bound

LOSSY = ("int8", "fp8_e4m3", "fp8_e5m2")
logger = logging.getLogger(__name__)


def measure(model: Any, hf_dir: str, pool_dtype: torch.dtype, kind: Optional[str]) -> tuple[float, int]:
    """(agreement of the pool form with the exact pool on the CHECK texts, positions)."""
    seqs = calibration.encode(hf_dir, calibration.CHECK)
    with torch.inference_mode():
        ref = calibration.teacher_forced_logits(model, seqs).argmax(-1)
        got = calibration.teacher_forced_logits(model, seqs, pool_dtype, kind).argmax(-1)
    return float((got == ref).float().mean()), int(got.numel())


def check_pool_form(model: Any, hf_dir: str, cache: CacheConfig, model_dtype: torch.dtype, pool_dtype: torch.dtype,
                    cache_path: Optional[str] = None) -> Optional[tuple[float, int]]:
    """Raise ValueError naming ``kv_cache_dtype`` when the pool's form misses the bar for this
    model; return its (agreement, positions), or None for an exact pool (nothing to check)."""
    kind = cache.kv_cache_dtype if cache.kv_quantized else None
    if kind is None and pool_dtype == model_dtype:
        return None
    if kind is not None:
        kv_quant.check_head_dim(model.kv_cache_shape()[1])
    path = cache_path if cache_path is not None else os.path.join(loader.cache_root(), "kv_accuracy.json")
    key = (f"{calibration.model_fingerprint(hf_dir)} | {str(model_dtype).removeprefix('torch.')} | "
           f"{cache.kv_cache_dtype} | calibration v{calibration.CALIBRATION_VERSION} | torch {torch.__version__}")
    saved = json_cache.load(path)
    entry = saved.get(key)
    if isinstance(entry, dict) and isinstance(entry.get("agreement"), float) and isinstance(entry.get("positions"), int):
        rate, n = entry["agreement"], entry["positions"]
    else:
        t0 = time.perf_counter()
        with stages.stage("accuracy check", f"KV pool form {cache.kv_cache_dtype} against the exact pool, once per "
                          "model"):
            rate, n = measure(model, hf_dir, pool_dtype, kind)
        logger.info("kv_cache_dtype %s: teacher-forced argmax agreement with the exact pool %.4f over %d positions "
                    "(%.1f s)", cache.kv_cache_dtype, rate, n, time.perf_counter() - t0)
        saved[key] = {"agreement": rate, "positions": n, "model": hf_dir, "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}
        json_cache.save(path, saved)
    low = lower_bound(rate, n)
    if low < BAR:
        raise ValueError(
            f"kv_cache_dtype: {cache.kv_cache_dtype} is not offered for this model: its next-token argmax agrees "
            f"with the exact KV pool at {100 * rate:.2f}% of {n} positions (lower bound {100 * low:.2f}%; the bar "
            f"is {100 * BAR:.0f}%, docs/KV_QUANTIZATION.md); use auto (the exact pool)"
            f"{'' if cache.kv_cache_dtype == 'int8' else ' or int8 (checked the same way)'}")
    return rate, n
