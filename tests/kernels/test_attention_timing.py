"""The measured rule for which extend blocks go to flash attention (worker/tuning/attention_timing.py):
the choice from timings, the cache, a failing measurement, a real measurement, the rule's two
paths giving the same attention, and the runner using the measured rule."""
from __future__ import annotations

import logging

import pytest
import torch

from radixserve.attention.cpu_backend import CpuBackend, DenseRule
from radixserve.kernels import cpu_native
from radixserve.mem_cache.kv_pool import KVPool
from radixserve.worker.tuning import attention_timing as at

from tests.helpers.models import make_engine

pytestmark = pytest.mark.skipif(not cpu_native.load(), reason="no C++ compiler: the cpu backend is not used")


def timings(causal: tuple, shared: tuple) -> dict:
    """(kernel, flash) seconds per size of ``at.SIZES``, for each kind."""
    return {"causal_kernel": [c[0] for c in causal], "causal_flash": [c[1] for c in causal],
            "shared_kernel": [s[0] for s in shared], "shared_flash": [s[1] for s in shared]}


def test_rule_takes_flash_from_the_smallest_size_where_it_won():
    t = timings(causal=((1, 2), (3, 4)), shared=((2, 1), (5, 4)))
    assert at.rule_from(t, 3) == DenseRule(shared_min_rows=at.SIZES[0] * 3, causal_min_rows=at.NEVER)
    t = timings(causal=((1, 2), (4, 3)), shared=((1, 1), (5, 5)))  # a tie keeps the kernel
    assert at.rule_from(t, 2) == DenseRule(shared_min_rows=at.NEVER, causal_min_rows=at.SIZES[1] * 2)


def test_rule_is_cached_per_layout_and_a_failure_keeps_the_default(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("RADIXSERVE_CACHE", str(tmp_path))
    calls = []

    def fake(dtype, hkv, d, g):
        calls.append((dtype, hkv, d, g))
        return timings(causal=((2, 1), (2, 1)), shared=((1, 2), (1, 2)))

    pool = KVPool(16, 1, 2, 64, torch.float32)
    want = DenseRule(at.NEVER, at.SIZES[0] * 4)
    assert at.dense_rule(pool, 4, fake) == want
    assert at.dense_rule(pool, 4, fake) == want and len(calls) == 1  # from the cache
    assert at.dense_rule(pool, 2, fake) == DenseRule(at.NEVER, at.SIZES[0] * 2) and len(calls) == 2

    def broken(*a):
        raise RuntimeError("no flash attention here")

    with caplog.at_level(logging.WARNING):
        assert at.dense_rule(KVPool(16, 1, 1, 64, torch.float32), 4, broken) == CpuBackend.default_rule(pool)
    assert "attention timing failed (no flash attention here)" in caplog.text


def test_real_measurement_gives_every_timing():
    t = at.measure(torch.float32, 1, 64, 2)
    assert sorted(t) == ["causal_flash", "causal_kernel", "shared_flash", "shared_kernel"]
    assert all(len(v) == len(at.SIZES) and all(x > 0 for x in v) for v in t.values())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_both_paths_of_the_rule_agree(dtype):
    """The timed blocks give the same attention through flash attention and through the kernel."""
    pool = KVPool(4096, 1, 2, 64, dtype)
    torch.manual_seed(0)
    pool.k_buffer[0].normal_()
    pool.v_buffer[0].normal_()
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    for batch in (at._batch(0, [600], pool), at._batch(256, [40, 70, 1], pool)):
        q = torch.randn(batch.num_tokens, 6, 64).to(dtype)
        outs = []
        for rule in (DenseRule(0, 0), DenseRule(1, 1)):
            backend = CpuBackend(pool, rule)
            batch.attn_metadata = None
            backend.init_forward_metadata(batch)
            outs.append(backend.attend(q, q, q, 0, 0.125, batch).float())
        assert torch.allclose(outs[0], outs[1], atol=tol, rtol=tol), (outs[0] - outs[1]).abs().max()


def test_runner_uses_the_measured_rule(tiny_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("RADIXSERVE_CACHE", str(tmp_path))
    seen = []
    monkeypatch.setattr(at, "measure", lambda *a: seen.append(a) or timings(((1, 2), (1, 2)), ((2, 1), (2, 1))))
    eng = make_engine(tiny_dir, dtype="float32", attention_backend="cpu")
    try:
        g = seen[0][3]
        assert eng.runner.backend.dense == DenseRule(at.SIZES[0] * g, at.NEVER)
        out = eng.generate(input_ids=[[1, 2, 3] * 200], sampling_params={"max_new_tokens": 2, "temperature": 0})
        assert len(out[0]["output_ids"]) == 2
        eng.check_invariants()
    finally:
        eng.shutdown()
