"""A quantized KV pool (``mem_cache/kv_quant.py``) on the CPU: the packed rows, the native
quantizing store (bit-equal to torch's), and attention over packed rows by the native kernel and
by torch_native, each against fp64 attention over the dequantized K/V (what the pool holds)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from radixserve.attention.cpu_backend import CpuBackend, DenseRule
from radixserve.attention.torch_native import TorchNativeBackend
from radixserve.kernels import cpu_native
from radixserve.mem_cache import kv_quant
from radixserve.mem_cache.kv_pool import KVPool

from tests.helpers.attention_reference import attention_reference
from tests.helpers.cpu_attention import make_lengths_case

pytestmark = pytest.mark.skipif(not cpu_native.load(), reason="the native CPU kernels do not build here")

KINDS = ("int8", "fp8_e4m3", "fp8_e5m2")


def quantized_copy(pool: KVPool, kind: str, dtype: torch.dtype = None) -> KVPool:
    """A packed pool of ``kind`` holding ``pool``'s K/V (every slot, every layer)."""
    q = KVPool(pool.num_slots, pool.num_layers, pool.num_kv_heads, pool.head_dim, dtype or pool.dtype, quant=kind)
    every = torch.arange(pool.num_slots)
    for layer in range(pool.num_layers):
        q.set_kv(layer, every, pool.k_buffer[layer].float(), pool.v_buffer[layer].float())
    return q


def reference(q: torch.Tensor, pool: KVPool, batch, scaling: float) -> torch.Tensor:
    k, v = pool.read_kv(0, torch.arange(pool.num_slots))
    return attention_reference(q, k.float(), v.float(), batch, scaling, torch.float64)


@pytest.mark.parametrize("kind", KINDS)
def test_packed_rows_round_trip(kind):
    x = torch.randn(7, 3, 64) * torch.logspace(-3, 3, 7).view(7, 1, 1)
    x[2, 1] = 0.0  # an all-zero row keeps a finite scale and decodes to zeros
    packed = kv_quant.quantize(x, kind)
    assert packed.dtype == torch.uint8 and packed.shape == (7, 3, 68)
    back = kv_quant.dequantize(packed, kind, torch.float32)
    assert torch.isfinite(back).all() and (back[2, 1] == 0).all()
    rel = ((back - x).abs().amax(-1) / x.abs().amax(-1).clamp(min=1e-30))
    bound = {"int8": 0.5 / 127, "fp8_e4m3": 2.0 ** -4, "fp8_e5m2": 2.0 ** -3}[kind]
    assert rel.max() <= bound * 1.01, rel.max()
    # the largest magnitude of each row maps to the format's largest code
    assert torch.allclose(kv_quant.scales(packed)[0], x[0].abs().amax(-1) / kv_quant.FORMATS[kind][1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", KINDS)
def test_native_store_equals_torch(kind, dtype):
    gen = torch.Generator().manual_seed(1)
    qkv = (torch.randn(9, 5 * 64, generator=gen) * 3).to(dtype)
    k = qkv[:, 64:192].view(9, 2, 64)  # strided views, as the model's split of its fused projection
    v = qkv[:, 192:].view(9, 2, 64)
    loc = torch.tensor([5, 1, 7, 2, 9, 3, 11, 4, 6])
    a = KVPool(12, 1, 2, 64, dtype, quant=kind)
    b = KVPool(12, 1, 2, 64, dtype, quant=kind)
    a.set_kv(0, loc, k, v)  # torch
    torch.ops.radixserve_cpu.store_kv_packed(k, v, loc, b.k_buffer[0], b.v_buffer[0], cpu_native.KV_FORMATS[kind])
    assert torch.equal(a.k_buffer[0], b.k_buffer[0]) and torch.equal(a.v_buffer[0], b.v_buffer[0])


def test_native_store_refuses_bad_arguments():
    pool = KVPool(4, 1, 2, 64, torch.float32, quant="int8")
    k = torch.randn(2, 2, 64)
    with pytest.raises(RuntimeError, match="out of range"):
        torch.ops.radixserve_cpu.store_kv_packed(k, k, torch.tensor([1, 4]), pool.k_buffer[0], pool.v_buffer[0], 1)
    with pytest.raises(RuntimeError, match="kv_format"):
        torch.ops.radixserve_cpu.store_kv_packed(k, k, torch.tensor([1, 2]), pool.k_buffer[0], pool.v_buffer[0], 0)


CASES = {  # (prefix lens, new lens, heads, kv heads, head dim, shared prefix)
    "decode": ([37, 120, 5], [1, 1, 1], 9, 3, 64, 0),
    "decode_shared": ([90, 90, 90, 90], [1, 1, 1, 1], 9, 3, 64, 64),
    "extend_prefix": ([0, 45, 70], [33, 20, 41], 9, 3, 64, 0),
    "extend_d128": ([30, 0], [17, 40], 4, 2, 128, 0),
    "extend_d80": ([21, 3], [12, 30], 4, 1, 80, 0),  # any head size: the generic path
    "decode_d80": ([50, 9], [1, 1], 4, 1, 80, 0),
}


@pytest.mark.parametrize("qdtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_cpu_kernel_reads_packed_rows(case, kind, qdtype):
    pre, ext, heads, kv_heads, d, shared = CASES[case]
    exact, batch, q = make_lengths_case(pre, ext, heads, kv_heads, d, torch.float32, seed=3, shared_prefix=shared)
    pool = quantized_copy(exact, kind, qdtype)
    be = CpuBackend(pool, DenseRule(0, 0))
    assert be.caller_stores_kv is None  # packed rows are written by store_kv only
    be.init_forward_metadata(batch)
    out = be.attend(q.to(qdtype), None, None, 0, d ** -0.5, batch)
    assert out.dtype == qdtype
    ref = reference(q.to(qdtype).float(), pool, batch, d ** -0.5)
    tol = 1e-5 if qdtype == torch.float32 else 2e-2
    err = (out.double() - ref).abs().max().item()
    assert err <= tol, f"{case} {kind} {qdtype}: max abs error {err:.3g}"


@pytest.mark.parametrize("kind", KINDS)
def test_cpu_flash_blocks_and_window_on_packed_rows(kind):
    """A shared prefix and a prompt's causal block through flash attention (``DenseRule(1, 1)``),
    and a sliding window with a soft-cap on the kernel's own tiles."""
    from radixserve.attention.base import LayerAttention

    pre, ext = [64, 64, 64], [20, 30, 1]
    exact, batch, q = make_lengths_case(pre, ext, 6, 2, 64, torch.float32, seed=5, shared_prefix=64)
    pool = quantized_copy(exact, kind)
    be = CpuBackend(pool, DenseRule(1, 1))
    be.init_forward_metadata(batch)
    out = be.attend(q, None, None, 0, 0.125, batch)
    err = (out.double() - reference(q, pool, batch, 0.125)).abs().max().item()
    assert err <= 1e-5, f"flash blocks on {kind}: {err:.3g}"

    la = LayerAttention(sliding_window=40, logit_softcap=30.0)
    be = CpuBackend(pool, DenseRule(0, 0))
    be.set_layer_attention([la])
    batch.attn_metadata = None
    be.init_forward_metadata(batch)
    out = be.attend(q, None, None, 0, 0.125, batch)
    k, v = pool.read_kv(0, torch.arange(pool.num_slots))
    ref = attention_reference(q, k, v, batch, 0.125, torch.float64, sliding_window=40, logit_softcap=30.0)
    err = (out.double() - ref).abs().max().item()
    assert err <= 1e-5, f"window + softcap on {kind}: {err:.3g}"


@pytest.mark.parametrize("kind", KINDS)
def test_torch_native_reads_packed_rows(kind):
    exact, batch, q = make_lengths_case([0, 45, 64, 64], [33, 20, 1, 1], 9, 3, 64, torch.float32, seed=7,
                                        shared_prefix=64)
    pool = quantized_copy(exact, kind)
    be = TorchNativeBackend(pool)
    be.init_forward_metadata(batch)
    out = be.attend(q, None, None, 0, 0.125, batch)
    err = (out.double() - reference(q, pool, batch, 0.125)).abs().max().item()
    assert err <= 1e-5, f"torch_native on {kind}: {err:.3g}"


def test_backends_store_the_same_packed_rows():
    """``CpuBackend.store_kv`` (native) and the base class's (torch) write equal rows."""
    exact, batch, q = make_lengths_case([10], [6], 4, 2, 64, torch.float32, seed=9)
    k, v = torch.randn(2, 6, 2, 64).unbind(0)
    pools = [quantized_copy(exact, "int8") for _ in range(2)]
    CpuBackend(pools[0], DenseRule(0, 0)).store_kv(0, batch, k, v)
    TorchNativeBackend(pools[1]).store_kv(0, batch, k, v)
    assert torch.equal(pools[0].k_buffer[0], pools[1].k_buffer[0])
    assert torch.equal(pools[0].v_buffer[0], pools[1].v_buffer[0])


def test_packed_pool_bytes():
    """A packed token takes head_dim + 4 bytes a head: 3.76x the tokens of an fp32 pool and
    1.88x those of a bf16 pool at head_dim 64 in the same memory."""
    fp32 = KVPool.bytes_per_slot(30, 3, 64, torch.float32)
    bf16 = KVPool.bytes_per_slot(30, 3, 64, torch.bfloat16)
    for kind in KINDS:
        packed = KVPool.bytes_per_slot(30, 3, 64, torch.float32, quant=kind)
        assert packed == 2 * 30 * 3 * 68
        pool = KVPool(10, 30, 3, 64, torch.bfloat16, quant=kind)
        assert pool.slot_bytes == packed and pool.total_bytes == 10 * packed
    assert fp32 / packed == pytest.approx(3.765, abs=1e-3) and bf16 / packed == pytest.approx(1.882, abs=1e-3)
    with pytest.raises(ValueError, match="head_dim divisible by 4"):
        KVPool(4, 1, 1, 66, torch.float32, quant="int8")
