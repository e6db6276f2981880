"""Sliding-window and logit-softcapped attention (``LayerAttention``) in every backend against the
reference (tests/helpers/attention_reference.py, HF's semantics): the native CPU kernel (fp32, and
bf16 on every path this CPU has), torch_native (with the cascade of its plain layers) and Triton
(under TRITON_INTERPRET=1: tests/helpers/triton_interpreter.py); windows
of 1, inside a shared prefix, and beyond the context; extend and decode; layers that differ; the
CPU plan's cut of key ranges; and the backends' feature checks and the registry's choice."""
import tests.helpers.triton_interpreter  # noqa: F401  (first: Triton under the interpreter)

import dataclasses
import importlib.util

import numpy as np
import pytest
import torch

from radixserve.attention import cpu_backend
from radixserve.attention.base import LayerAttention
from radixserve.attention.cpu_backend import CpuBackend
from radixserve.attention.cpu_plan import build_plan
from radixserve.attention.registry import create_attention_backend
from radixserve.attention.torch_native import TorchNativeBackend
from radixserve.kernels import cpu_native
from radixserve.mem_cache.kv_pool import KVPool

from tests.helpers.attention_cases import layered_case
from tests.helpers.attention_reference import attention_reference
from tests.helpers.cpu_attention import DOT, TOL, check

needs_kernel = pytest.mark.skipif(not cpu_native.load(), reason="no C++ compiler for the native kernel")
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")

# Requests 2-5 share their first 48 cached slots; windows end inside that prefix, before it, past it.
# (Extend: torch_native buckets requests 0, 2, 3 and 5 together, so its cascade has a group.)
EXTEND = ([0, 5, 60, 70, 90, 100, 33], [37, 1, 20, 30, 1, 40, 7])
DECODE = ([0, 5, 60, 70, 90, 100, 33, 130], [1] * 8)
SHARED = 48
MODS = [LayerAttention(1), LayerAttention(8), LayerAttention(40), LayerAttention(10_000),
        LayerAttention(None, 30.0), LayerAttention(16, 5.0)]
MOD_IDS = ["w1", "w8", "w40", "w_beyond", "cap", "w16cap"]
MIXED = [LayerAttention(), LayerAttention(8), LayerAttention(None, 5.0), LayerAttention(40, 20.0)]


def reference(q, pool, batch, layer: int, la: LayerAttention) -> torch.Tensor:
    return attention_reference(q, pool.k_buffer[layer], pool.v_buffer[layer], batch, q.shape[-1] ** -0.5,
                               torch.float64, la.sliding_window, la.logit_softcap)


def cpu_run(pool, batch, q, layers: list[LayerAttention], layer: int = 0) -> torch.Tensor:
    """Layer ``layer``'s output of a fresh ``CpuBackend`` with ``layers`` (dot products as ``DOT`` says)."""
    be = CpuBackend(pool, dataclasses.replace(CpuBackend.default_rule(pool), bf16_dot=DOT["on"]))
    be.set_layer_attention(layers)
    be.init_forward_metadata(batch)
    return be.attend(q, None, None, layer, q.shape[-1] ** -0.5, batch)


@needs_kernel
@pytest.mark.parametrize("la", MODS, ids=MOD_IDS)
@pytest.mark.parametrize("lens", [EXTEND, DECODE], ids=["extend", "decode"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cpu_kernel_matches_the_reference(dtype, lens, la):
    pool, batch, q = layered_case(*lens, 9, 3, 64, dtype, shared_prefix=SHARED, seed=3)
    out = cpu_run(pool, batch, q, [la])
    check(out, reference(q, pool, batch, 0, la), dtype)


@needs_kernel
@pytest.mark.parametrize("heads,kv_heads,d", [(8, 1, 128), (4, 4, 80), (6, 2, 64)],
                         ids=["gqa8-d128", "mha-d80", "gqa3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cpu_kernel_head_shapes(dtype, heads, kv_heads, d):
    """Head dim 128 and the generic (any head dim) tiles, extend and decode, window and cap."""
    la = LayerAttention(16, 5.0)
    for lens in (EXTEND, DECODE):
        pool, batch, q = layered_case(*lens, heads, kv_heads, d, dtype, shared_prefix=SHARED, seed=d)
        check(cpu_run(pool, batch, q, [la]), reference(q, pool, batch, 0, la), dtype)


@needs_kernel
@pytest.mark.parametrize("path", [0, 1, (1, True), 2, (2, True)], ids=["fp32tiles", "avx512", "avx512dot", "amx",
                                                                       "amxdot"])
def test_cpu_bf16_paths(bf16_mode, path):
    """Every bf16-pool path (AMX blocks need 4+ query rows: the extend step's GQA-3 tasks)."""
    bf16_mode(path)
    for la in (LayerAttention(8), LayerAttention(40, 5.0), LayerAttention(None, 2.0)):
        for lens in (EXTEND, DECODE):
            pool, batch, q = layered_case(*lens, 9, 3, 64, torch.bfloat16, shared_prefix=SHARED, seed=5)
            check(cpu_run(pool, batch, q, [la]), reference(q, pool, batch, 0, la), torch.bfloat16)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_kernel_window_on_the_plain_plan_and_a_wrong_window_fails(dtype):
    """The kernel masks and skips by itself: a window on the plain plan's tasks (shared prefix
    included) matches the reference, and a window one key wider does not."""
    pool, batch, q = layered_case(*EXTEND, 9, 3, 64, dtype, shared_prefix=SHARED, seed=7)
    plain = CpuBackend(pool)
    plain.init_forward_metadata(batch)
    plain.attend(q, None, None, 0, 0.125, batch)
    plan = batch.attn_metadata
    assert plan.num_shared_groups == 1
    ref = reference(q, pool, batch, 0, LayerAttention(8, 5.0))
    for window, cap, good in ((8, 5.0, True), (9, 5.0, False), (8, 0.0, False)):
        out = cpu_native.paged_attention(q, pool.k_buffer[0], pool.v_buffer[0], batch.req_to_token, plan,
                                         batch.positions, 0.125, torch.empty_like(q), window=window, softcap=cap)
        if good:
            check(out, ref, dtype)
        else:
            with pytest.raises(AssertionError):
                check(out, ref, dtype)


@needs_kernel
def test_cpu_long_decode_window_splits_the_window_only():
    """One request at 4096 tokens, window 512: the plan reads 512 keys (split across the
    threads), not 4096, and the result matches the reference."""
    pool, batch, q = layered_case([4095], [1], 9, 3, 64, torch.float32, seed=11)
    la = LayerAttention(512)
    check(cpu_run(pool, batch, q, [la]), reference(q, pool, batch, 0, la), torch.float32)
    rows = batch.req_to_token[batch.req_pool_indices].numpy()
    plan = build_plan(rows, batch.req_pool_indices.numpy(), np.array([4096]), np.array([1]), np.array([0]),
                      3, 3, 2, window=512)
    tasks = plan.tasks.numpy()
    assert sorted((a, b) for a, b in tasks[:, 1:3])[0][0] == 4096 - 512
    assert int((tasks[:, 2] - tasks[:, 1]).sum()) == 512 and len(tasks) > 1


def test_window_plan_cuts_and_drops_shared_prefixes():
    """Three members of a 512-token shared prefix decode at 600: a window of 64 drops the shared
    task (wholly left of every window), a window of 200 cuts it to the keys they see."""
    seq = np.array([600, 600, 600])
    rows = np.zeros((3, 600), dtype=np.int32)
    rows[:, :512] = np.arange(1, 513)
    rows[:, 512:] = np.arange(1000, 1000 + 3 * 88).reshape(3, 88)
    args = (rows, np.arange(3), seq, np.ones(3, dtype=np.int64), np.arange(3), 3, 3, 1)
    ranges = lambda plan: sorted((int(t[1]), int(t[2]), int(t[4] - t[3])) for t in plan.tasks)  # noqa: E731
    assert ranges(build_plan(*args)) == [(0, 512, 3), (512, 600, 1), (512, 600, 1), (512, 600, 1)]
    assert ranges(build_plan(*args, window=64)) == [(536, 600, 1)] * 3
    assert ranges(build_plan(*args, window=200)) == [(400, 512, 3), (512, 600, 1), (512, 600, 1), (512, 600, 1)]
    for window in (64, 200):
        plan = build_plan(*args, window=window)
        assert (np.diff(plan.tok_ptr.numpy()) >= 1).all(), "every token keeps an entry"


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cpu_dense_blocks_only_where_the_window_hides_nothing(monkeypatch, dtype):
    """With flash-attention blocks on, a window's plan keeps a block only where the window hides
    none of its keys (the 37-token prompt's causal block under a window of 40, not 16; the shared
    prefix under neither), a soft-capped layer has none, and every layer matches the reference."""
    monkeypatch.setattr(cpu_backend, "DENSE_MIN_ROWS", 1)
    monkeypatch.setattr(cpu_backend, "AMX_BF16", -99)  # the AMX rule keeps causal blocks in the kernel
    layers = [LayerAttention(), LayerAttention(16), LayerAttention(None, 5.0), LayerAttention(40),
              LayerAttention(10_000)]
    pool, batch, q = layered_case(*EXTEND, 9, 3, 64, dtype, num_layers=len(layers), shared_prefix=SHARED, seed=13)
    be = CpuBackend(pool)
    be.set_layer_attention(layers)
    be.init_forward_metadata(batch)
    for layer, la in enumerate(layers):
        check(be.attend(q, None, None, layer, 0.125, batch), reference(q, pool, batch, layer, la), dtype)
    blocks = {k: (sum(c for *_, c in plan.dense), sum(not c for *_, c in plan.dense))
              for k, plan in batch.attn_metadata.plans.items()}
    # (causal blocks, shared-prefix blocks) by (window, soft-capped, sliding pool); a window past every row is none
    assert blocks == {(None, False, False): (1, 1), (16, False, False): (0, 0), (None, True, False): (0, 0),
                      (40, False, False): (1, 0)}


@needs_kernel
@pytest.mark.parametrize("lens", [EXTEND, DECODE], ids=["extend", "decode"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cpu_step_attention_with_layers_that_differ(monkeypatch, dtype, lens):
    """The one-call-per-layer path binds each layer's plan, window and cap (no native plan for the
    layer stack), and falls back to the general path for a layer with flash-attention blocks."""
    pool, batch, q = layered_case(*lens, 9, 3, 64, dtype, num_layers=len(MIXED), shared_prefix=SHARED, seed=17)
    for dense_rows in (cpu_backend.DENSE_MIN_ROWS, 1):
        monkeypatch.setattr(cpu_backend, "DENSE_MIN_ROWS", dense_rows)
        be = CpuBackend(pool)
        be.set_layer_attention(MIXED)
        be.init_forward_metadata(batch)
        assert be.native_plan(batch, 9) is None
        attend = be.step_attention(batch, 9)
        for layer, la in enumerate(MIXED):
            check(attend(q, layer, 0.125).clone(), reference(q, pool, batch, layer, la), dtype)


@pytest.mark.parametrize("lens", [EXTEND, DECODE], ids=["extend", "decode"])
def test_torch_native_with_layers_that_differ(lens):
    """Plain layers keep the cascade over the shared prefix; the others gather with their masks."""
    pool, batch, q = layered_case(*lens, 9, 3, 64, torch.float32, num_layers=len(MIXED), shared_prefix=SHARED,
                                  seed=19)
    be = TorchNativeBackend(pool)
    be.set_layer_attention(MIXED)
    be.init_forward_metadata(batch)
    assert any(b.cascade is not None for b in batch.attn_metadata)
    for layer, la in enumerate(MIXED):
        check(be.attend(q, None, None, layer, 0.125, batch), reference(q, pool, batch, layer, la), torch.float32)
    be.set_layer_attention(MIXED[1:] + [LayerAttention(1)])  # no plain layer: no cascade to build
    be.init_forward_metadata(batch)
    assert all(b.cascade is None for b in batch.attn_metadata)
    for layer, la in enumerate(be.layer_attention):
        check(be.attend(q, None, None, layer, 0.125, batch), reference(q, pool, batch, layer, la), torch.float32)


@needs_triton
@pytest.mark.parametrize("lens", [([0, 13, 40, 5], [9, 1, 21, 40]), ([0, 13, 40, 70], [1] * 4)],
                         ids=["extend", "decode"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_triton_backend_with_layers_that_differ(dtype, lens):
    """Both kernels (extend with 16-token blocks, decode with 1-4 KV splits) for windows of 1
    and 8, a cap, and a window with a cap, under the interpreter."""
    from radixserve.attention.triton_backend import TritonBackend

    layers = [LayerAttention(1), LayerAttention(8), LayerAttention(None, 5.0), LayerAttention(20, 2.0)]
    pool, batch, q = layered_case(*lens, 6, 2, 64, dtype, num_layers=len(layers), seed=23)
    be = TritonBackend(pool, max_kv_splits=4, min_tokens_per_split=8, extend_block_m=16, extend_block_n=16,
                       decode_block_n=16)
    be.set_layer_attention(layers)
    be.init_forward_metadata(batch)
    tol = 1e-4 if dtype == torch.float32 else TOL[dtype]
    for layer, la in enumerate(layers):
        k, v = (buf[layer][batch.out_cache_loc].clone() for buf in (pool.k_buffer, pool.v_buffer))
        out = be.forward(q, k, v, layer, 0.125, batch)
        err = (out.double() - reference(q, pool, batch, layer, la)).abs().max().item()
        assert err <= tol, f"layer {layer} ({la}): max abs error {err:.3g} > {tol}"


class _PlainOnly(TorchNativeBackend):
    supported_features = frozenset()


def test_set_layer_attention_names_the_missing_feature():
    pool = KVPool(16, 2, 1, 8, torch.float32)
    be = _PlainOnly(pool)
    with pytest.raises(ValueError, match="does not support logit_softcap, sliding_window"):
        be.set_layer_attention([LayerAttention(4), LayerAttention(None, 2.0)])
    be.set_layer_attention([LayerAttention(), LayerAttention()])
    assert be.plain
    with pytest.raises(ValueError, match="layers"):
        TorchNativeBackend(pool).set_layer_attention([LayerAttention(4)])


def test_backend_names():
    pool = KVPool(16, 1, 1, 8, torch.float32)
    assert TorchNativeBackend(pool).name == "torch_native"
    if cpu_native.load():
        assert CpuBackend(pool).name == "cpu"
    if importlib.util.find_spec("triton") is not None:
        assert create_attention_backend("triton", pool, torch.device("cpu")).name == "triton"


@needs_kernel
def test_auto_picks_a_backend_that_supports_every_layer(monkeypatch):
    pool = KVPool(16, 2, 1, 8, torch.float32)
    cpu = torch.device("cpu")
    layers = [LayerAttention(4), LayerAttention(None, 30.0)]
    be = create_attention_backend("auto", pool, cpu, layers=layers)
    assert be.name == "cpu" and be.layer_attention == layers and not be.plain
    monkeypatch.setattr(CpuBackend, "supported_features", frozenset({"sliding_window"}))
    be = create_attention_backend("auto", pool, cpu, layers=layers)
    assert be.name == "torch_native" and be.layer_attention == layers
    assert create_attention_backend("auto", pool, cpu, layers=[LayerAttention(4)] * 2).name == "cpu"
    with pytest.raises(ValueError, match="cpu backend does not support logit_softcap"):
        create_attention_backend("cpu", pool, cpu, layers=layers)
