"""The native CPU kernel at batch-64 decode shapes (SmolLM2's heads, contexts of 32-600 keys),
through the one-call-per-layer path the model runs (``CpuBackend.step_attention``): every bf16
path and fp32 against the fp64 per-request reference and torch_native, repeated calls with
other head sizes in between (the per-thread scratch is reused across calls), and a plan that
drops each request's last key, which the check must catch."""
from __future__ import annotations

import random

import pytest
import torch

from radixserve.attention.cpu_backend import CpuBackend
from radixserve.attention.torch_native import TorchNativeBackend
from radixserve.kernels import cpu_native

from tests.helpers.cpu_attention import check, make_lengths_case, reference

pytestmark = pytest.mark.skipif(not cpu_native.load(), reason="no C++ compiler: test_attention_cpu.py covers the fallback")


def decode_case(d: int, dtype: torch.dtype, seed: int, bsz: int = 64):
    """``bsz`` decode requests with 31-599 cached keys each: 31-47 (a tile and a part) for most,
    599, 200, 150 and 100 for every 16th (within make_lengths_case's 4000 slots)."""
    rng = random.Random(seed)
    longs = [599, 200, 150, 100]
    prefix = [rng.choice([31, 39, 47]) if i % 16 else longs[i // 16 % 4] for i in range(bsz)]
    return make_lengths_case(prefix, [1] * bsz, 9, 3, d, dtype, seed=seed)


def step_out(pool, batch, q):
    """The layer-0 output of the step path (plan built once, one kernel call), copied."""
    be = CpuBackend(pool)
    be.init_forward_metadata(batch)
    attend = be.step_attention(batch, q.shape[1])
    return attend(q, 0, q.shape[-1] ** -0.5).clone(), batch.attn_metadata


@pytest.mark.parametrize("dtype,path", [(torch.float32, None), (torch.bfloat16, 0), (torch.bfloat16, 1),
                                        (torch.bfloat16, 2)], ids=["fp32", "bf16-fp32tiles", "bf16-avx512", "bf16-amx"])
def test_batch64_decode_matches_reference_and_torch_native(bf16_mode, dtype, path):
    if path is not None:
        bf16_mode(path)
    pool, batch, q = decode_case(64, dtype, seed=3)
    out, plan = step_out(pool, batch, q)
    assert plan.tasks.shape[0] == 64  # one task a request: no split, no shared group
    ref = reference(q, pool, batch, 0.125)
    check(out, ref, dtype)
    tn = TorchNativeBackend(pool)
    tn.init_forward_metadata(batch)
    check(out, tn.attend(q, None, None, 0, 0.125, batch).double(), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_repeated_calls_with_other_head_sizes_between(dtype):
    """D = 64, then 128, then 80 (the generic path), then 64 again in one process: each call
    matches the reference whatever the thread's scratch held before."""
    for i, d in enumerate((64, 128, 80, 64)):
        pool, batch, q = decode_case(d, dtype, seed=10 + i, bsz=16)
        out, _ = step_out(pool, batch, q)
        check(out, reference(q, pool, batch, d ** -0.5), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_a_plan_missing_each_last_key_fails_the_check(dtype):
    """Each task's key range cut by one (the token's own key left out): the reference check
    must fail, so the decode tests above can tell a lost key from rounding."""
    pool, batch, q = decode_case(64, dtype, seed=5)
    be = CpuBackend(pool)
    be.init_forward_metadata(batch)
    attend = be.step_attention(batch, q.shape[1])
    plan = batch.attn_metadata
    ref = reference(q, pool, batch, 0.125)
    check(attend(q, 0, 0.125).clone(), ref, dtype)
    plan.tasks[:, 2] -= 1  # the bound step function holds this very tensor
    with pytest.raises(AssertionError):
        check(attend(q, 0, 0.125).clone(), ref, dtype)
