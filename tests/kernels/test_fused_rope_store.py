"""The fused attention prologue ``rope_store_kv`` (kernels/cpu/fused_ops.cpp) against the unfused
path it replaces: rotary in place on views of the fused projection, then ``index_copy_`` into the pool."""
from __future__ import annotations

import pytest
import torch

from radixserve.kernels import cpu_native
from radixserve.model.cpu.fused_ops import NativeCpuOps, TorchOps
from radixserve.model.layers.rotary import RotaryEmbedding

pytestmark = pytest.mark.skipif(not cpu_native.load(), reason="no C++ compiler: the model keeps the unfused path")
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
SHAPES = pytest.mark.parametrize("heads,kv_heads,dim,tokens", [(9, 3, 64, 1), (9, 3, 64, 37), (8, 8, 128, 5),
                                                               (4, 1, 64, 16)])


def _case(dtype: torch.dtype, heads: int, kv_heads: int, dim: int, tokens: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    rot = RotaryEmbedding(dim, 4096, {"rope_theta": 100000.0, "rope_type": "default"})
    qkv = (3 * torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=g)).to(dtype)
    positions = torch.randint(0, 4000, (tokens,), generator=g)
    loc = torch.randperm(200, generator=g)[:tokens] + 1  # distinct slots, never the padding slot 0
    pool = (torch.randn(201, kv_heads, dim, generator=g).to(dtype), torch.randn(201, kv_heads, dim, generator=g).to(dtype))
    return rot, qkv, positions, loc, pool


def _unfused(ops, rot, qkv, positions, loc, pool, heads: int, kv_heads: int, dim: int):
    """The model's path before the fusion: split, views, rope_ in place, index_copy_, contiguous q."""
    k_buf, v_buf = pool[0].clone(), pool[1].clone()
    q, k, v = qkv.clone().split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    q, k, v = q.view(-1, heads, dim), k.view(-1, kv_heads, dim), v.view(-1, kv_heads, dim)
    ops.rope_(q, k, positions, rot.cos, rot.sin)
    k_buf.index_copy_(0, loc, k)
    v_buf.index_copy_(0, loc, v)
    return q.contiguous(), k_buf, v_buf


def _fused(ops, rot, qkv, positions, loc, pool, heads: int, dim: int):
    k_buf, v_buf = pool[0].clone(), pool[1].clone()
    q_out = torch.full((qkv.shape[0], heads, dim), float("nan"), dtype=qkv.dtype)
    q = ops.rope_store_kv(qkv, positions, rot.cos, rot.sin, k_buf, v_buf, loc, q_out)
    assert q is q_out
    return q, k_buf, v_buf


@DTYPES
@SHAPES
def test_native_equals_unfused_native_path_bit_for_bit(dtype, heads, kv_heads, dim, tokens):
    rot, qkv, positions, loc, pool = _case(dtype, heads, kv_heads, dim, tokens)
    before = qkv.clone()
    want = _unfused(NativeCpuOps, rot, qkv, positions, loc, pool, heads, kv_heads, dim)
    got = _fused(NativeCpuOps, rot, qkv, positions, loc, pool, heads, dim)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    assert torch.equal(qkv, before), "qkv is read only"
    untouched = torch.ones(201, dtype=torch.bool)
    untouched[loc] = False
    assert torch.equal(got[1][untouched], pool[0][untouched]) and torch.equal(got[2][untouched], pool[1][untouched])


@DTYPES
@SHAPES
def test_native_matches_torch_reference(dtype, heads, kv_heads, dim, tokens):
    rot, qkv, positions, loc, pool = _case(dtype, heads, kv_heads, dim, tokens, seed=1)
    ref = _unfused(TorchOps, rot, qkv, positions, loc, pool, heads, kv_heads, dim)
    assert all(torch.equal(a, b) for a, b in zip(_fused(TorchOps, rot, qkv, positions, loc, pool, heads, dim), ref))
    got = _fused(NativeCpuOps, rot, qkv, positions, loc, pool, heads, dim)
    tol = 2e-6 if dtype == torch.float32 else 1e-2  # torch's vectorized rope may round differently by an ulp
    for a, b in zip(got, ref):
        err = ((a.float() - b.float()).abs() / (1 + b.float().abs())).max().item()
        assert err <= tol, err
    assert torch.equal(got[2], ref[2]), "v is copied exactly"


def test_a_wrong_variant_fails_the_check():
    """The comparison above catches a swapped rotation sign and a K/V written to the wrong slot."""
    heads, kv_heads, dim = 9, 3, 64
    rot, qkv, positions, loc, pool = _case(torch.float32, heads, kv_heads, dim, 7, seed=2)
    want = _unfused(NativeCpuOps, rot, qkv, positions, loc, pool, heads, kv_heads, dim)
    q_out = torch.empty(7, heads, dim)
    k_buf, v_buf = pool[0].clone(), pool[1].clone()
    NativeCpuOps.rope_store_kv(qkv, positions, rot.cos, -rot.sin, k_buf, v_buf, loc, q_out)  # rotation reversed
    assert not torch.equal(q_out, want[0]) and not torch.equal(k_buf, want[1])
    k_buf, v_buf = pool[0].clone(), pool[1].clone()
    NativeCpuOps.rope_store_kv(qkv, positions, rot.cos, rot.sin, k_buf, v_buf, loc.roll(1), q_out)  # slots shifted
    assert torch.equal(q_out, want[0]) and not torch.equal(k_buf, want[1]) and not torch.equal(v_buf, want[2])


def test_rejects_bad_slots_and_dtypes():
    rot, qkv, positions, loc, pool = _case(torch.float32, 9, 3, 64, 3)
    q_out = torch.empty(3, 9, 64)
    with pytest.raises(RuntimeError, match="out of range"):
        NativeCpuOps.rope_store_kv(qkv, positions, rot.cos, rot.sin, pool[0], pool[1], loc + 1000, q_out)
    with pytest.raises(RuntimeError, match="one dtype"):
        NativeCpuOps.rope_store_kv(qkv, positions, rot.cos, rot.sin, pool[0].bfloat16(), pool[1].bfloat16(), loc,
                                   q_out)
