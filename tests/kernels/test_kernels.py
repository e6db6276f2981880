"""Triton kernels and TritonBackend on CPU, through Triton's interpreter.

TRITON_INTERPRET must be set before triton's @jit decorators run, i.e. before
radixserve.kernels is imported, so it is set at the very top of this module.  It leaks
into the rest of this pytest process: on a CUDA machine run tests/kernels/test_gpu.py in its own
process (``pytest tests/kernels/test_gpu.py``), never together with this module.

Oracles: the per-request loop of tests/helpers/attention_reference.py (fp32 math) and
TorchNativeBackend.  Slot 0 is the padding slot; request slots are a random permutation
of 1..S-1 so the paging (req_to_token indirection) is exercised.
"""
import os

os.environ["TRITON_INTERPRET"] = "1"

import math
import sys

import pytest

pytest.importorskip("triton")

import torch

# If another test module imported the kernels first (compiled mode), re-import them
# so that their @triton.jit objects are interpreter functions.
for _name in [m for m in sys.modules if m == "radixserve.kernels" or m.startswith("radixserve.kernels.")]:
    del sys.modules[_name]

from radixserve.attention.base import ForwardMode
from radixserve.attention.registry import create_attention_backend
from radixserve.attention.torch_native import TorchNativeBackend
from radixserve.attention.triton_backend import TritonBackend
from radixserve.kernels import decode_attention_fwd, extend_attention_fwd, store_kv
from radixserve.mem_cache.kv_pool import KVPool

from tests.helpers.attention_cases import assert_close, clone_pool, decode_after, paged_batch, random_pool, random_qkv
from tests.helpers.attention_reference import attention_reference

# bf16 works under the interpreter (loads/stores/casts are exact); the kernels upcast the
# tl.dot operands to fp32 there because triton 3.9's interpreter multiplies bf16 bit
# patterns as integers.  P is still rounded to bf16 before the PV product, as on a GPU.
TOL = {
    torch.float32: dict(atol=1e-4, rtol=1e-4),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
}
MAX_CTX = 96
SMALL_BLOCKS = dict(extend_block_m=16, extend_block_n=16, decode_block_n=16, decode_block_h=16)

# (num_heads, num_kv_heads): GQA ratios 1, 3, 8
HEADS = {1: (2, 2), 3: (6, 2), 8: (8, 1)}


def _assert_close(out, ref, dtype, what):
    assert_close(out, ref, what, **TOL[dtype])


def make_batch(prefix_lens, ext_lens, num_kv_heads, head_dim, dtype, mode=ForwardMode.EXTEND,
               num_layers=1, seed=0):
    """A random pool with each request's prefix stored, and the step's ForwardBatch.

    Returns (pool, batch, gen): prefix K/V live in the pool at random slots; the new
    tokens' slots are assigned in ``batch.out_cache_loc`` but not written yet.
    """
    gen = torch.Generator().manual_seed(seed)
    bsz = len(prefix_lens)
    seq_lens = [p + e for p, e in zip(prefix_lens, ext_lens)]
    num_slots = sum(seq_lens) + 1 + 7  # + padding slot 0 + a few never-used slots
    pool = random_pool(num_slots, num_layers, num_kv_heads, head_dim, dtype, gen)
    slots = torch.randperm(num_slots - 1, generator=gen)[: sum(seq_lens)] + 1
    rows = torch.randperm(2 * bsz + 3, generator=gen)[:bsz]
    req_to_token = torch.zeros((2 * bsz + 3, MAX_CTX), dtype=torch.int32)
    off, out_loc = 0, []
    for i in range(bsz):
        req_to_token[rows[i], : seq_lens[i]] = slots[off: off + seq_lens[i]].to(torch.int32)
        out_loc.append(slots[off + prefix_lens[i]: off + seq_lens[i]])
        off += seq_lens[i]
    return pool, paged_batch(mode, req_to_token, rows, prefix_lens, ext_lens, torch.cat(out_loc)), gen


def qkv(batch, num_heads, num_kv_heads, head_dim, dtype, gen):
    return random_qkv(batch.num_tokens, num_heads, num_kv_heads, head_dim, dtype, gen)


def kernel_vs_references(name, kernel, pool, batch, gen, gqa, head_dim, dtype):
    """Random q/k/v of the step, k/v stored by ``store_kv``, then ``kernel(q, k, v, out,
    scaling)`` against the loop reference and torch_native (on the pool as it was before)."""
    num_heads, num_kv_heads = HEADS[gqa]
    q, k, v = qkv(batch, num_heads, num_kv_heads, head_dim, dtype, gen)
    scaling = 1.0 / math.sqrt(head_dim)
    native_pool = clone_pool(pool)
    store_kv(k, v, pool.k_buffer[0], pool.v_buffer[0], batch.out_cache_loc)
    out = torch.empty_like(q)
    kernel(q, k, v, out, scaling)
    _assert_close(out, attention_reference(q, pool.k_buffer[0], pool.v_buffer[0], batch, scaling), dtype,
                  f"{name} vs loop reference")
    native = TorchNativeBackend(native_pool)
    native.init_forward_metadata(batch)
    _assert_close(out, native.forward(q, k, v, 0, scaling, batch), dtype, f"{name} vs torch_native")


# Mixed prefixes (including 0), mixed new lengths (1 and > one 16-block).
EXTEND_CASE = ([0, 13, 40, 5], [9, 1, 21, 16])


def random_lens(seed, bsz=4):
    """Random (prefix_lens, extend_lens): one prefix is 0, one extend is 1, some span
    several 16-token blocks."""
    g = torch.Generator().manual_seed(1000 + seed)
    prefix = torch.randint(0, 45, (bsz,), generator=g).tolist()
    ext = torch.randint(1, 25, (bsz,), generator=g).tolist()
    prefix[seed % bsz] = 0
    ext[(seed + 1) % bsz] = 1
    return prefix, ext


def random_decode_lens(seed, bsz=4):
    g = torch.Generator().manual_seed(2000 + seed)
    seq = torch.randint(2, 70, (bsz,), generator=g).tolist()
    seq[seed % bsz] = 1  # a request whose context is just its new token
    return seq


EXTEND_PARAMS = [(g, d, torch.float32) for g in (1, 3, 8) for d in (64, 128)] + [
    (3, 64, torch.bfloat16), (8, 128, torch.bfloat16)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_store_kv(dtype):
    pool, batch, gen = make_batch(*EXTEND_CASE, num_kv_heads=2, head_dim=64, dtype=dtype)
    t = batch.num_tokens
    # k/v as non-contiguous views of a fused qkv projection, fp32 into a `dtype` pool.
    fused = torch.randn((t, 3, 2, 64), generator=gen)
    k, v = fused[:, 1], fused[:, 2]
    expect_k = pool.k_buffer[0].clone().index_copy_(0, batch.out_cache_loc, k.to(dtype))
    expect_v = pool.v_buffer[0].clone().index_copy_(0, batch.out_cache_loc, v.to(dtype))
    store_kv(k, v, pool.k_buffer[0], pool.v_buffer[0], batch.out_cache_loc)
    assert torch.equal(pool.k_buffer[0], expect_k), "store_kv K differs from index_copy_ (exact)"
    assert torch.equal(pool.v_buffer[0], expect_v), "store_kv V differs from index_copy_ (exact)"


@pytest.mark.parametrize("gqa,head_dim,dtype", EXTEND_PARAMS)
def test_extend_kernel(gqa, head_dim, dtype):
    seed = gqa + head_dim
    pool, batch, gen = make_batch(*random_lens(seed), HEADS[gqa][1], head_dim, dtype, seed=seed)

    def extend(q, k, v, out, scaling):
        extend_attention_fwd(
            q, k, v, out, pool.k_buffer[0], pool.v_buffer[0], batch.req_to_token,
            batch.req_pool_indices, batch.seq_lens, batch.extend_prefix_lens, batch.extend_seq_lens,
            batch.extend_start_loc, max(batch.extend_seq_lens_cpu), scaling, block_m=16, block_n=16,
        )

    kernel_vs_references("extend kernel", extend, pool, batch, gen, gqa, head_dim, dtype)


@pytest.mark.parametrize("gqa,head_dim,dtype", EXTEND_PARAMS)
def test_decode_kernel(gqa, head_dim, dtype):
    seed = 10 + gqa + head_dim
    seq = random_decode_lens(seed)
    # 1..4 KV splits per request (max 4); the 1-token context gets 4: three empty splits.
    splits = [4 if n == 1 else 1 + (n + i) % 4 for i, n in enumerate(seq)]
    pool, batch, gen = make_batch([n - 1 for n in seq], [1] * len(seq), HEADS[gqa][1], head_dim, dtype,
                                  mode=ForwardMode.DECODE, seed=seed)

    def decode(q, k, v, out, scaling):
        decode_attention_fwd(
            q, pool.k_buffer[0], pool.v_buffer[0], out, batch.req_to_token, batch.req_pool_indices,
            batch.seq_lens, torch.tensor(splits, dtype=torch.int32), 4, scaling, block_n=16, block_h=16,
        )

    kernel_vs_references("decode kernel", decode, pool, batch, gen, gqa, head_dim, dtype)


@pytest.mark.parametrize("gqa,head_dim,dtype", [(3, 64, torch.float32), (8, 128, torch.bfloat16)])
def test_triton_backend_matches_torch_native(gqa, head_dim, dtype):
    """Two layers, an EXTEND step then a DECODE step on the same requests."""
    num_heads, num_kv_heads = HEADS[gqa]
    prefix, ext = [0, 7, 22], [12, 1, 5]
    pool, batch, gen = make_batch(prefix, ext, num_kv_heads, head_dim, dtype, num_layers=2, seed=20 + gqa)
    native_pool = clone_pool(pool)
    triton_be = TritonBackend(pool, max_kv_splits=4, min_tokens_per_split=8, **SMALL_BLOCKS)
    native_be = TorchNativeBackend(native_pool)
    scaling = 1.0 / math.sqrt(head_dim)

    def step(b):
        triton_be.init_forward_metadata(b)
        tri_meta = b.attn_metadata
        native_be.init_forward_metadata(b)
        nat_meta = b.attn_metadata
        for layer in range(2):
            q, k, v = qkv(b, num_heads, num_kv_heads, head_dim, dtype, gen)
            b.attn_metadata = tri_meta
            out = triton_be.forward(q, k, v, layer, scaling, b)
            b.attn_metadata = nat_meta
            ref = native_be.forward(q, k, v, layer, scaling, b)
            assert out.dtype == q.dtype and out.shape == q.shape
            _assert_close(out, ref, dtype, f"TritonBackend vs torch_native, {b.mode.name} layer {layer}")
            for name in ("k_buffer", "v_buffer"):
                assert torch.equal(getattr(pool, name)[layer], getattr(native_pool, name)[layer]), (
                    f"{name}[{layer}] after {b.mode.name}: kv_store differs from KVPool.set_kv (exact)")
        return tri_meta

    step(batch)
    dec = decode_after(batch, pool)  # one more token per request, in never-used slots
    meta = step(dec)
    assert meta.num_kv_splits.tolist() == [min(4, -(-n // 8)) for n in dec.seq_lens_cpu]


def test_create_attention_backend_triton():
    pool = KVPool(8, 1, 1, 16, torch.float32)
    assert isinstance(create_attention_backend("triton", pool, torch.device("cpu")), TritonBackend)


def test_flashinfer_kv_indices_and_lazy_import():
    """The CSR page table FlashInferBackend hands to flashinfer (checkable without it)."""
    had_flashinfer = "flashinfer" in sys.modules
    from radixserve.attention.flashinfer_backend import build_kv_indices

    assert had_flashinfer or "flashinfer" not in sys.modules, "importing the backend module imported flashinfer"
    _, batch, _ = make_batch(*EXTEND_CASE, num_kv_heads=1, head_dim=16, dtype=torch.float32)
    indptr, indices = build_kv_indices(batch.req_to_token, batch.req_pool_indices, batch.seq_lens,
                                       sum(batch.seq_lens_cpu))
    expect = torch.cat([batch.req_to_token[r, :n] for r, n in zip(batch.req_pool_indices, batch.seq_lens_cpu)])
    assert indptr.dtype == torch.int32 and indices.dtype == torch.int32
    assert indptr.tolist() == [0] + torch.cumsum(batch.seq_lens, 0).tolist()
    assert torch.equal(indices, expect.to(torch.int32))
