"""Triton kernels and TritonBackend on CPU, through Triton's interpreter.

TRITON_INTERPRET must be set before triton's @jit decorators run, i.e. before
radixserve.kernels is imported, so it is set at the very top of this module.  It leaks
into the rest of this pytest process: on a CUDA machine run tests/kernels/test_gpu.py in its own
process (``pytest tests/kernels/test_gpu.py``), never together with this module.

Oracles: a per-request loop in plain torch (``ref_attention``, fp32 math) and
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

from radixserve.attention.base import ForwardBatch, ForwardMode
from radixserve.attention.registry import create_attention_backend
from radixserve.attention.torch_native import TorchNativeBackend
from radixserve.attention.triton_backend import TritonBackend
from radixserve.kernels import decode_attention_fwd, extend_attention_fwd, store_kv
from radixserve.mem_cache.kv_pool import KVPool

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
    tol = TOL[dtype]
    torch.testing.assert_close(
        out.float(), ref.float(), **tol,
        msg=lambda m: f"{what} ({dtype}, atol={tol['atol']}, rtol={tol['rtol']}): {m}",
    )


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
    pool = KVPool(num_slots, num_layers, num_kv_heads, head_dim, dtype)
    for layer in range(num_layers):
        pool.k_buffer[layer].copy_(torch.randn(pool.k_buffer[layer].shape, generator=gen))
        pool.v_buffer[layer].copy_(torch.randn(pool.v_buffer[layer].shape, generator=gen))
    slots = torch.randperm(num_slots - 1, generator=gen)[: sum(seq_lens)] + 1
    rows = torch.randperm(2 * bsz + 3, generator=gen)[:bsz]
    req_to_token = torch.zeros((2 * bsz + 3, MAX_CTX), dtype=torch.int32)
    off, out_loc, positions = 0, [], []
    for i in range(bsz):
        req_to_token[rows[i], : seq_lens[i]] = slots[off: off + seq_lens[i]].to(torch.int32)
        out_loc.append(slots[off + prefix_lens[i]: off + seq_lens[i]])
        positions.append(torch.arange(prefix_lens[i], seq_lens[i]))
        off += seq_lens[i]
    ext = torch.tensor(ext_lens, dtype=torch.int64)
    num_tokens = int(ext.sum())
    batch = ForwardBatch(
        mode=mode,
        input_ids=torch.zeros(num_tokens, dtype=torch.int64),
        positions=torch.cat(positions),
        out_cache_loc=torch.cat(out_loc).to(torch.int64),
        req_pool_indices=rows.to(torch.int64),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int64),
        extend_prefix_lens=torch.tensor(prefix_lens, dtype=torch.int64),
        extend_seq_lens=ext,
        extend_start_loc=torch.cumsum(ext, 0) - ext,
        req_to_token=req_to_token,
        seq_lens_cpu=list(seq_lens),
        extend_prefix_lens_cpu=list(prefix_lens),
        extend_seq_lens_cpu=list(ext_lens),
    )
    return pool, batch, gen


def qkv(batch, num_heads, num_kv_heads, head_dim, dtype, gen):
    t = batch.num_tokens
    q = torch.randn((t, num_heads, head_dim), generator=gen).to(dtype)
    k = torch.randn((t, num_kv_heads, head_dim), generator=gen).to(dtype)
    v = torch.randn((t, num_kv_heads, head_dim), generator=gen).to(dtype)
    return q, k, v


def ref_attention(q, k_buf, v_buf, batch, scaling):
    """Loop-over-requests oracle, fp32; K/V of the new tokens must already be stored."""
    out = torch.empty(q.shape, dtype=torch.float32)
    group = q.shape[1] // k_buf.shape[1]
    for i in range(batch.batch_size):
        row = batch.req_to_token[batch.req_pool_indices[i], : batch.seq_lens_cpu[i]].long()
        keys = k_buf[row].float().repeat_interleave(group, 1)
        vals = v_buf[row].float().repeat_interleave(group, 1)
        s0, n = int(batch.extend_start_loc[i]), batch.extend_seq_lens_cpu[i]
        scores = torch.einsum("qhd,khd->hqk", q[s0: s0 + n].float(), keys) * scaling
        pos = batch.extend_prefix_lens_cpu[i] + torch.arange(n)
        scores = scores.masked_fill(torch.arange(len(row))[None, None, :] > pos[None, :, None], float("-inf"))
        out[s0: s0 + n] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), vals)
    return out


def clone_pool(pool):
    other = KVPool(pool.num_slots, pool.num_layers, pool.num_kv_heads, pool.head_dim, pool.dtype)
    for layer in range(pool.num_layers):
        other.k_buffer[layer].copy_(pool.k_buffer[layer])
        other.v_buffer[layer].copy_(pool.v_buffer[layer])
    return other


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
    num_heads, num_kv_heads = HEADS[gqa]
    seed = gqa + head_dim
    pool, batch, gen = make_batch(*random_lens(seed), num_kv_heads, head_dim, dtype, seed=seed)
    q, k, v = qkv(batch, num_heads, num_kv_heads, head_dim, dtype, gen)
    scaling = 1.0 / math.sqrt(head_dim)
    native_pool = clone_pool(pool)
    store_kv(k, v, pool.k_buffer[0], pool.v_buffer[0], batch.out_cache_loc)
    out = torch.empty_like(q)
    extend_attention_fwd(
        q, k, v, out, pool.k_buffer[0], pool.v_buffer[0], batch.req_to_token,
        batch.req_pool_indices, batch.seq_lens, batch.extend_prefix_lens, batch.extend_seq_lens,
        batch.extend_start_loc, max(batch.extend_seq_lens_cpu), scaling, block_m=16, block_n=16,
    )
    _assert_close(out, ref_attention(q, pool.k_buffer[0], pool.v_buffer[0], batch, scaling), dtype,
                  "extend kernel vs loop reference")
    native = TorchNativeBackend(native_pool)
    native.init_forward_metadata(batch)
    _assert_close(out, native.forward(q, k, v, 0, scaling, batch), dtype, "extend kernel vs torch_native")


@pytest.mark.parametrize("gqa,head_dim,dtype", EXTEND_PARAMS)
def test_decode_kernel(gqa, head_dim, dtype):
    num_heads, num_kv_heads = HEADS[gqa]
    seed = 10 + gqa + head_dim
    seq = random_decode_lens(seed)
    # 1..4 KV splits per request (max 4); the 1-token context gets 4: three empty splits.
    splits = [4 if n == 1 else 1 + (n + i) % 4 for i, n in enumerate(seq)]
    pool, batch, gen = make_batch([n - 1 for n in seq], [1] * len(seq), num_kv_heads, head_dim, dtype,
                                  mode=ForwardMode.DECODE, seed=seed)
    q, k, v = qkv(batch, num_heads, num_kv_heads, head_dim, dtype, gen)
    scaling = 1.0 / math.sqrt(head_dim)
    native_pool = clone_pool(pool)
    store_kv(k, v, pool.k_buffer[0], pool.v_buffer[0], batch.out_cache_loc)
    out = torch.empty_like(q)
    decode_attention_fwd(
        q, pool.k_buffer[0], pool.v_buffer[0], out, batch.req_to_token, batch.req_pool_indices,
        batch.seq_lens, torch.tensor(splits, dtype=torch.int32), 4, scaling, block_n=16, block_h=16,
    )
    _assert_close(out, ref_attention(q, pool.k_buffer[0], pool.v_buffer[0], batch, scaling), dtype,
                  "decode kernel vs loop reference")
    native = TorchNativeBackend(native_pool)
    native.init_forward_metadata(batch)
    _assert_close(out, native.forward(q, k, v, 0, scaling, batch), dtype, "decode kernel vs torch_native")


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
    # Decode: one more token per request, in fresh free slots (never-used ones of the pool).
    used = set(batch.req_to_token[batch.req_pool_indices].flatten().tolist())
    free = [s for s in range(1, pool.num_slots) if s not in used][: batch.batch_size]
    seq = [n + 1 for n in batch.seq_lens_cpu]
    for i, s in enumerate(free):
        batch.req_to_token[batch.req_pool_indices[i], seq[i] - 1] = s
    ones = torch.ones(batch.batch_size, dtype=torch.int64)
    dec = ForwardBatch(
        mode=ForwardMode.DECODE,
        input_ids=torch.zeros(batch.batch_size, dtype=torch.int64),
        positions=torch.tensor(seq) - 1,
        out_cache_loc=torch.tensor(free, dtype=torch.int64),
        req_pool_indices=batch.req_pool_indices,
        seq_lens=torch.tensor(seq),
        extend_prefix_lens=torch.tensor(seq) - 1,
        extend_seq_lens=ones,
        extend_start_loc=torch.arange(batch.batch_size),
        req_to_token=batch.req_to_token,
        seq_lens_cpu=seq,
        extend_prefix_lens_cpu=[n - 1 for n in seq],
        extend_seq_lens_cpu=[1] * batch.batch_size,
    )
    meta = step(dec)
    assert meta.num_kv_splits.tolist() == [min(4, -(-n // 8)) for n in seq]


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
