"""A hybrid KV pool (sliding-window layers in a pool of their own, ``KVPool.is_sliding``) in every
backend: the sliding layers read and write through ``swa_req_to_token``/``swa_out_cache_loc``,
the full layers through the full table, and the outputs equal the reference over one full pool
even where the sliding table holds stale slots outside every window (reclaimed sliding KV) and
where two requests that share a prefix hold different sliding slots for it.  The native CPU
kernel (its general and one-call-per-layer paths), torch_native, and Triton under
TRITON_INTERPRET=1 (tests/helpers/triton_interpreter.py)."""
import tests.helpers.triton_interpreter  # noqa: F401  (first: Triton under the interpreter)

import importlib.util

import pytest
import torch

from radixserve.attention.base import ForwardBatch, LayerAttention
from radixserve.attention.cpu_backend import CpuBackend
from radixserve.attention.registry import create_attention_backend
from radixserve.attention.torch_native import TorchNativeBackend
from radixserve.kernels import cpu_native
from radixserve.mem_cache.kv_pool import KVPool

from tests.helpers.attention_cases import layered_case
from tests.helpers.attention_reference import attention_reference
from tests.helpers.cpu_attention import check

needs_kernel = pytest.mark.skipif(not cpu_native.load(), reason="no C++ compiler for the native kernel")
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")

EXTEND = ([0, 5, 60, 70, 90, 100, 33], [37, 1, 20, 30, 1, 40, 7])
DECODE = ([0, 5, 60, 70, 90, 100, 33, 130], [1] * 8)
SKEW = ([130, 60, 5], [3, 20, 9])  # the first request sharing the prefix has a stale part of it
SHARED = 48
LAYERS = [LayerAttention(), LayerAttention(8), LayerAttention(None, 5.0), LayerAttention(40, 20.0),
          LayerAttention(16)]
WINDOW = 40  # the longest window: what the scheduler keeps of each request's sliding KV


def hybrid_case(lens, dtype, layers=LAYERS, seed=0) -> tuple[KVPool, KVPool, ForwardBatch, torch.Tensor]:
    """(the full pool, the same KV as a hybrid pool, the step's batch with both tables, q): sliding
    slots are a random permutation of the full ones; a row's positions before its window (first
    new position - WINDOW) hold random sliding slots (stale), different in every row."""
    full, batch, q = layered_case(*lens, 9, 3, 64, dtype, num_layers=len(layers), shared_prefix=SHARED, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    sliding = [i for i, la in enumerate(layers) if la.sliding_window is not None]
    n = full.num_slots
    hybrid = KVPool(n, len(layers), full.num_kv_heads, full.head_dim, dtype, sliding_layers=sliding,
                    num_swa_slots=n + 5)
    swa_of = torch.cat([torch.zeros(1, dtype=torch.int64), torch.randperm(n + 4, generator=gen)[: n - 1] + 1])
    for layer in range(len(layers)):
        for src, dst in ((full.k_buffer, hybrid.k_buffer), (full.v_buffer, hybrid.v_buffer)):
            if hybrid.is_sliding[layer]:
                dst[layer][swa_of] = src[layer]
            else:
                dst[layer].copy_(src[layer])
    table = batch.req_to_token
    swa_table = swa_of[table.long()].to(torch.int32)
    for row, start in zip(batch.req_pool_indices.tolist(), batch.extend_prefix_lens.tolist()):
        stale = max(0, start - WINDOW)
        swa_table[row, :stale] = torch.randint(0, n + 5, (stale,), generator=gen, dtype=torch.int32)
    batch.swa_req_to_token = swa_table
    batch.swa_out_cache_loc = swa_of[batch.out_cache_loc]
    return full, hybrid, batch, q


def reference(q, pool, batch, layer: int, la: LayerAttention = None) -> torch.Tensor:
    la = la or LAYERS[layer]
    return attention_reference(q, pool.k_buffer[layer], pool.v_buffer[layer], batch, q.shape[-1] ** -0.5,
                               torch.float64, la.sliding_window, la.logit_softcap)


def test_hybrid_pool_shapes_and_tables():
    pool = KVPool(100, 3, 2, 8, torch.float32, sliding_layers=[1], num_swa_slots=30)
    assert pool.hybrid and pool.is_sliding == [False, True, False]
    assert [b.shape[0] for b in pool.k_buffer] == [100, 30, 100]
    assert pool.total_bytes == 2 * (100 + 30 + 100) * 2 * 8 * 4
    _, hybrid, batch, _ = hybrid_case(DECODE, torch.float32)
    assert batch.layer_slots(hybrid, 1)[1] is batch.swa_req_to_token
    assert batch.layer_slots(hybrid, 0)[0] is batch.out_cache_loc


@needs_kernel
@pytest.mark.parametrize("lens", [EXTEND, DECODE, SKEW], ids=["extend", "decode", "skew"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cpu_backend_reads_each_layer_through_its_table(dtype, lens):
    full, hybrid, batch, q = hybrid_case(lens, dtype, seed=3)
    be = CpuBackend(hybrid)
    be.set_layer_attention(LAYERS)
    be.init_forward_metadata(batch)
    for layer in range(len(LAYERS)):
        check(be.attend(q, None, None, layer, 0.125, batch), reference(q, full, batch, layer), dtype)
    be.init_forward_metadata(batch)
    attend = be.step_attention(batch, 9)
    for layer in range(len(LAYERS)):
        check(attend(q, layer, 0.125).clone(), reference(q, full, batch, layer), dtype)


@needs_kernel
def test_a_wrong_table_is_caught():
    """The check above can fail: the sliding layers read through the full table go wrong."""
    full, hybrid, batch, q = hybrid_case(EXTEND, torch.float32, seed=5)
    batch.swa_req_to_token = batch.req_to_token
    be = CpuBackend(hybrid)
    be.set_layer_attention(LAYERS)
    be.init_forward_metadata(batch)
    with pytest.raises(AssertionError):
        check(be.attend(q, None, None, 1, 0.125, batch), reference(q, full, batch, 1), torch.float32)


@pytest.mark.parametrize("lens", [EXTEND, DECODE, SKEW], ids=["extend", "decode", "skew"])
def test_torch_native_reads_each_layer_through_its_table(lens):
    full, hybrid, batch, q = hybrid_case(lens, torch.float32, seed=7)
    be = TorchNativeBackend(hybrid)
    be.set_layer_attention(LAYERS)
    be.init_forward_metadata(batch)
    for layer in range(len(LAYERS)):
        check(be.attend(q, None, None, layer, 0.125, batch), reference(q, full, batch, layer), torch.float32)


@needs_triton
@pytest.mark.parametrize("lens", [([60, 5, 50], [9, 1, 21]), ([60, 5, 50], [1, 1, 1])], ids=["extend", "decode"])
def test_triton_reads_and_stores_each_layer_through_its_table(lens):
    """A full layer, a window and a capped window (the interpreter is slow: three layers, small
    batches; the first request holds a stale part of the prefix the third reads)."""
    from radixserve.attention.triton_backend import TritonBackend

    layers = [LAYERS[0], LAYERS[1], LAYERS[3]]
    full, hybrid, batch, q = hybrid_case(lens, torch.float32, layers, seed=11)
    be = TritonBackend(hybrid, max_kv_splits=4, min_tokens_per_split=8, extend_block_m=16, extend_block_n=16,
                       decode_block_n=16)
    be.set_layer_attention(layers)
    be.init_forward_metadata(batch)
    for layer, la in enumerate(layers):
        k, v = (buf[layer][batch.out_cache_loc].clone() for buf in (full.k_buffer, full.v_buffer))
        out = be.forward(q, k, v, layer, 0.125, batch)
        err = (out.double() - reference(q, full, batch, layer, la)).abs().max().item()
        assert err <= 1e-4, f"layer {layer}: max abs error {err:.3g}"
    loc, _ = batch.layer_slots(hybrid, 1)
    assert torch.equal(hybrid.k_buffer[1][loc], full.k_buffer[1][batch.out_cache_loc])


def test_a_backend_without_the_sliding_pool_is_refused():
    from radixserve.attention.registry import sliding_pool_supported

    pool = KVPool(64, 2, 1, 8, torch.float32, sliding_layers=[1], num_swa_slots=16)
    assert sliding_pool_supported("auto") and sliding_pool_supported("torch_native")
    assert not sliding_pool_supported("flashinfer")
    with pytest.raises(ValueError, match="flashinfer backend does not read a sliding-window pool"):
        create_attention_backend("flashinfer", pool, torch.device("cpu"), layers=[LayerAttention(), LayerAttention(4)])
