"""Triton kernels and TritonBackend over a quantized KV pool (packed rows, mem_cache/kv_quant.py),
on CPU through Triton's interpreter (set before radixserve.kernels is imported: see
tests/helpers/triton_interpreter.py; on a CUDA machine run tests/kernels/test_gpu.py in its own
process, never together with this module).

Oracles: ``store_kv`` packs rows as ``kv_quant.quantize`` does, bit for bit; attention over the
quantized pool equals the loop reference of tests/helpers/attention_reference.py over the pool's
dequantized K/V (``KVPool.read_kv``), to fp32 rounding.
"""
import tests.helpers.triton_interpreter  # noqa: F401  (first: TRITON_INTERPRET=1)

import importlib.util
import math

import pytest
import torch

from radixserve import kernels  # its Triton names import triton when first used
from radixserve.attention.base import ForwardMode
from radixserve.attention.registry import _auto, create_attention_backend
from radixserve.attention.triton_backend import TritonBackend
from radixserve.mem_cache import kv_quant
from radixserve.mem_cache.kv_pool import KVPool

from tests.helpers.attention_cases import assert_close, decode_after, layered_case, random_qkv
from tests.helpers.attention_reference import attention_reference

KINDS = ("int8", "fp8_e4m3", "fp8_e5m2")
TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}
HEADS, KV_HEADS, D = 6, 2, 64  # GQA 3
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
SCALING = 1.0 / math.sqrt(D)


def quant_case(kind, prefix_lens, ext_lens, dtype=torch.float32, num_layers=1, seed=0):
    """(pool, batch, q): ``layered_case`` (shuffled slots, one shared prefix) with its K/V packed
    into a ``kind`` pool."""
    exact, batch, q = layered_case(prefix_lens, ext_lens, HEADS, KV_HEADS, D, dtype, num_layers=num_layers,
                                   shared_prefix=4, seed=seed)
    pool = KVPool(exact.num_slots, num_layers, KV_HEADS, D, dtype, quant=kind)
    every = torch.arange(exact.num_slots)
    for layer in range(num_layers):
        pool.set_kv(layer, every, exact.k_buffer[layer], exact.v_buffer[layer])
    return pool, batch, q


def store_new(pool, batch, seed, layer=0):
    """Random K/V of the new tokens, stored by ``store_kv``; checks the rows it wrote."""
    gen = torch.Generator().manual_seed(100 + seed)
    _, k, v = random_qkv(batch.num_tokens, 1, KV_HEADS, D, pool.dtype, gen)
    kb, vb = pool.k_buffer[layer], pool.v_buffer[layer]
    kernels.store_kv(k, v, kb, vb, batch.out_cache_loc, kv_quant=pool.quant)
    loc = batch.out_cache_loc
    assert torch.equal(kb[loc], kv_quant.quantize(k, pool.quant)), "store_kv K != kv_quant.quantize"
    assert torch.equal(vb[loc], kv_quant.quantize(v, pool.quant)), "store_kv V != kv_quant.quantize"
    return k, v


def reference(pool, batch, q, layer=0, **mods):
    k, v = pool.read_kv(layer, torch.arange(pool.num_slots))
    return attention_reference(q, k, v, batch, SCALING, **mods)


def run_extend(pool, batch, q, k, v, **mods):
    out = torch.empty_like(q)
    return kernels.extend_attention_fwd(
        q, k, v, out, pool.k_buffer[0], pool.v_buffer[0], batch.req_to_token, batch.req_pool_indices,
        batch.seq_lens, batch.extend_prefix_lens, batch.extend_seq_lens, batch.extend_start_loc,
        max(batch.extend_seq_lens_cpu), SCALING, block_m=16, block_n=16, kv_quant=pool.quant, **mods)


def run_decode(pool, batch, q, **mods):
    # 1..4 splits per request (max 4); a 1-token context gets 4, three of them empty
    splits = [4 if n == 1 else 1 + (n + i) % 4 for i, n in enumerate(batch.seq_lens_cpu)]
    out = torch.empty_like(q)
    return kernels.decode_attention_fwd(
        q, pool.k_buffer[0], pool.v_buffer[0], out, batch.req_to_token, batch.req_pool_indices, batch.seq_lens,
        torch.tensor(splits, dtype=torch.int32), 4, SCALING, block_n=16, block_h=16, kv_quant=pool.quant, **mods)


@needs_triton
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_store_kv_packs_like_kv_quant(kind, dtype):
    """Bit for bit, from non-contiguous K/V, with int8 ties (amax 127: scale 1, x.5 codes), zero
    rows and signed zeros; slots not in ``loc`` untouched."""
    gen = torch.Generator().manual_seed(7)
    t, s = 24, 40
    fused = torch.randn((t, 3, KV_HEADS, D), generator=gen) * torch.logspace(-4, 4, t)[:, None, None, None]
    fused[0, 1, 0] = torch.arange(D) - 31.5
    fused[0, 1, 0, 0] = 127.0
    fused[1, 1, 1] = 0.0
    fused[2, 2, 0, :8] = -0.0
    k, v = fused[:, 1].to(dtype), fused[:, 2].to(dtype)
    loc = torch.randperm(s - 1, generator=gen)[:t] + 1
    kb = torch.randint(0, 256, (s, KV_HEADS, D + 4), generator=gen, dtype=torch.uint8)
    vb = kb.clone()
    before = kb.clone()
    kernels.store_kv(k, v, kb, vb, loc, kv_quant=kind)
    assert torch.equal(kb[loc], kv_quant.quantize(k, kind)), "K rows != kv_quant.quantize"
    assert torch.equal(vb[loc], kv_quant.quantize(v, kind)), "V rows != kv_quant.quantize"
    rest = torch.ones(s, dtype=torch.bool)
    rest[loc] = False
    assert torch.equal(kb[rest], before[rest]) and torch.equal(vb[rest], before[rest])


@needs_triton
@pytest.mark.parametrize("kind", KINDS)
def test_extend_kernel_quant(kind):
    pool, batch, q = quant_case(kind, [0, 13, 40, 5], [9, 1, 21, 16], seed=1)
    k, v = store_new(pool, batch, 1)
    assert_close(run_extend(pool, batch, q, k, v), reference(pool, batch, q), f"extend over {kind}",
                 **TOL[torch.float32])


@needs_triton
@pytest.mark.parametrize("kind", KINDS)
def test_decode_kernel_quant(kind):
    pool, batch, q = quant_case(kind, [0, 13, 40, 60, 5], [1] * 5, seed=2)
    store_new(pool, batch, 2)
    assert_close(run_decode(pool, batch, q), reference(pool, batch, q), f"decode over {kind}", **TOL[torch.float32])


@needs_triton
@pytest.mark.parametrize("mode", [ForwardMode.EXTEND, ForwardMode.DECODE])
def test_window_and_softcap_quant(mode):
    mods = dict(sliding_window=7, logit_cap=5.0)
    if mode == ForwardMode.EXTEND:
        pool, batch, q = quant_case("fp8_e4m3", [3, 30], [20, 4], seed=3)
        out = run_extend(pool, batch, q, *store_new(pool, batch, 3), **mods)
    else:
        pool, batch, q = quant_case("fp8_e4m3", [2, 30], [1, 1], seed=4)
        store_new(pool, batch, 4)
        out = run_decode(pool, batch, q, **mods)
    ref = reference(pool, batch, q, sliding_window=7, logit_softcap=5.0)
    assert_close(out, ref, f"{mode.name} with window and cap", **TOL[torch.float32])


@needs_triton
@pytest.mark.parametrize("kind,dtype", [("int8", torch.float32), ("fp8_e5m2", torch.bfloat16)])
def test_triton_backend_quant(kind, dtype):
    """Two layers, an EXTEND step then a DECODE step; K/V stored by the backend."""
    pool, batch, _ = quant_case(kind, [0, 7, 22], [12, 1, 5], dtype=dtype, num_layers=2, seed=5)
    backend = TritonBackend(pool, max_kv_splits=4, min_tokens_per_split=8, extend_block_m=16, extend_block_n=16,
                            decode_block_n=16, decode_block_h=16)
    assert backend.caller_stores_kv is None
    gen = torch.Generator().manual_seed(6)

    def step(b):
        backend.init_forward_metadata(b)
        for layer in range(2):
            q, k, v = random_qkv(b.num_tokens, HEADS, KV_HEADS, D, dtype, gen)
            out = backend.forward(q, k, v, layer, SCALING, b)
            assert out.dtype == dtype and out.shape == q.shape
            assert torch.equal(pool.k_buffer[layer][b.out_cache_loc], kv_quant.quantize(k, kind))
            assert_close(out, reference(pool, b, q, layer), f"TritonBackend {b.mode.name} layer {layer} over {kind}",
                         **TOL[dtype])

    step(batch)
    step(decode_after(batch, pool))


def test_flashinfer_refuses_quantized_pool():
    """FlashInfer's paged KV takes one scale per tensor: a quantized pool is refused (before
    flashinfer is imported) and auto picks triton on CUDA."""
    pool = KVPool(8, 1, 1, 16, torch.bfloat16, quant="int8")
    with pytest.raises(ValueError, match="does not read a quantized KV pool"):
        create_attention_backend("flashinfer", pool, torch.device("cpu"))
    assert _auto(pool, torch.device("cuda"), frozenset()) == "triton"
