"""The native CPU attention kernel (``--attention-backend cpu``) against a per-request
reference and against torch_native, on random batches: mixed cached-prefix lengths (0
included), mixed new lengths (1 included), shared and unshared prefixes, GQA 1/3/8, head dims
64 and 128, fp32 and bf16; plus the plan, KV splits, sensitivity to a broken mask or merge,
and the fallback when the kernel cannot be built."""
from __future__ import annotations

import logging
import random

import numpy as np
import pytest
import torch

from radixserve.attention import cpu_backend
from radixserve.attention.base import ForwardMode
from radixserve.attention.cpu_backend import CpuBackend
from radixserve.attention.cpu_plan import build_plan
from radixserve.attention.registry import create_attention_backend
from radixserve.attention.torch_native import TorchNativeBackend
from radixserve.kernels import cpu_native
from radixserve.mem_cache.kv_pool import KVPool

from tests.helpers.attention_cases import rows_case
from tests.helpers.cpu_attention import DOT, check, make_lengths_case, reference, run_cpu

pytestmark = pytest.mark.skipif(not cpu_native.load(), reason="no C++ compiler: the fallback test covers this")


def make_case(seed: int, mode: ForwardMode, heads: int, kv_heads: int, d: int, dtype: torch.dtype,
              shared: bool, n_req: int = 9, long_single: bool = False):
    """(pool, batch, q) of random requests; they do not sit in table rows 0..B-1.  Shared:
    requests draw their cached prefix from three common slot lists (so their rows start with
    the same slots)."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    slots = 6000
    pool = KVPool(slots, 1, kv_heads, d, dtype)
    free = list(range(1, slots))
    rng.shuffle(free)
    commons = [[free.pop() for _ in range(rng.randrange(40, 120))] for _ in range(3)]
    rows, prefix_lens, ext_lens = [], [], []
    for i in range(1 if long_single else n_req):
        if long_single:
            base = [free.pop() for _ in range(700)]
        elif shared and i < n_req - 1:
            c = commons[i % 3]
            base = c[: rng.randrange(33, len(c) + 1)] + [free.pop() for _ in range(rng.randrange(0, 20))]
        else:
            base = [free.pop() for _ in range(rng.choice([0, 0, 1, 5, 37, 70]))]
        if mode == ForwardMode.DECODE:
            n = 1
            if not base:
                base = [free.pop()]
        else:
            n = rng.choice([1, 1, 2, 7, 30, 70])
        rows.append(base + [free.pop() for _ in range(n)])
        prefix_lens.append(len(base))
        ext_lens.append(n)
    order = list(range(3, 3 + len(rows)))
    rng.shuffle(order)
    batch, q = rows_case(pool, mode, rows, prefix_lens, ext_lens, heads, gen, table_rows=order)
    return pool, batch, q


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (9, 3), (8, 1)], ids=["mha", "gqa3", "gqa8"])
@pytest.mark.parametrize("mode", [ForwardMode.EXTEND, ForwardMode.DECODE], ids=["extend", "decode"])
@pytest.mark.parametrize("shared", [True, False], ids=["shared", "unshared"])
def test_kernel_matches_reference_and_torch_native(dtype, d, heads, kv_heads, mode, shared):
    seed = hash((str(dtype), d, heads, mode.value, shared)) % 10_000
    pool, batch, q = make_case(seed, mode, heads, kv_heads, d, dtype, shared)
    out, plan = run_cpu(pool, batch, q)
    assert out.dtype == dtype and out.shape == q.shape
    assert (plan.num_shared_groups > 0) == shared
    ref = reference(q, pool, batch, d ** -0.5)
    check(out, ref, dtype)
    native = TorchNativeBackend(pool)
    native.init_forward_metadata(batch)
    check(out, native.attend(q, None, None, 0, d ** -0.5, batch).double(), dtype)


@pytest.mark.parametrize("mode", [ForwardMode.EXTEND, ForwardMode.DECODE], ids=["extend", "decode"])
def test_long_single_request_is_split_across_threads(mode):
    pool, batch, q = make_case(7, mode, 9, 3, 64, torch.float32, False, long_single=True)
    out, plan = run_cpu(pool, batch, q)
    if mode == ForwardMode.DECODE and torch.get_num_threads() > 1:
        assert plan.tasks.shape[0] > 1 and int(plan.tok_ptr[1]) > 1, "one decode request: its keys are split"
    check(out, reference(q, pool, batch, 0.125), torch.float32)


def test_broken_mask_or_merge_fails_the_check():
    """The checks above are sharp enough to catch an off-by-one mask or a merge that drops entries."""
    pool, batch, q = make_case(3, ForwardMode.EXTEND, 9, 3, 64, torch.float32, True)
    ref = reference(q, pool, batch, 0.125)
    be = CpuBackend(pool)
    be.init_forward_metadata(batch)
    good = be.attend(q, None, None, 0, 0.125, batch)
    check(good, ref, torch.float32)
    plan = batch.attn_metadata
    leaky = batch.positions + 1  # every token also sees the next key: a causal mask off by one
    bad = cpu_native.paged_attention(q, pool.k_buffer[0], pool.v_buffer[0], batch.req_to_token, plan, leaky,
                                        0.125, torch.empty_like(q))
    with pytest.raises(AssertionError):
        check(bad, ref, torch.float32)
    first_only = plan.tok_ptr.clone()
    first_only[1:] = first_only[:-1] + 1  # merge only each token's first entry
    broken = type(plan)(plan.tasks, plan.entry_tok, first_only, plan.tok_entries)
    bad = cpu_native.paged_attention(q, pool.k_buffer[0], pool.v_buffer[0], batch.req_to_token, broken,
                                        batch.positions, 0.125, torch.empty_like(q))
    with pytest.raises(AssertionError):
        check(bad, ref, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (9, 3), (8, 1)], ids=["mha", "gqa3", "gqa8"])
@pytest.mark.parametrize("mode", [ForwardMode.EXTEND, ForwardMode.DECODE], ids=["extend", "decode"])
def test_dense_groups_match_the_reference(monkeypatch, dtype, d, heads, kv_heads, mode):
    """Shared prefixes computed by torch's flash attention and merged by the kernel."""
    monkeypatch.setattr(cpu_backend, "DENSE_MIN_ROWS", 1)
    pool, batch, q = make_case(17 + d + heads, mode, heads, kv_heads, d, dtype, True)
    out, plan = run_cpu(pool, batch, q)
    assert plan.num_shared_groups == sum(not causal for *_, causal in plan.dense) > 0
    ref = reference(q, pool, batch, d ** -0.5)
    check(out, ref, dtype)
    be = CpuBackend(pool)
    parts = be._dense_parts(q, 0, d ** -0.5, batch, plan)
    parts[1][: len(plan.dense[0][4])] += 1.0  # a dense partial weighted wrongly in the merge must show
    bad = cpu_native.paged_attention(q, pool.k_buffer[0], pool.v_buffer[0], batch.req_to_token, plan,
                                     batch.positions, d ** -0.5, torch.empty_like(q), parts)
    with pytest.raises(AssertionError):
        check(bad, ref, dtype)


def test_dense_groups_only_past_the_row_threshold():
    seq = np.array([600, 600, 600])
    rows = np.zeros((3, 600), dtype=np.int32)
    rows[:, :512] = np.arange(1, 513)
    rows[:, 512:] = np.arange(1000, 1000 + 3 * 88).reshape(3, 88)
    ext = np.array([88, 88, 88])
    start = np.array([0, 88, 176])
    plan = build_plan(rows, np.arange(3), seq, ext, start, 3, 3, 2, dense_min_rows=3 * 88 * 3)
    assert len(plan.dense) == 1 and not any(t[2] - t[1] == 512 for t in plan.tasks.numpy())
    row, ks, ke, e0, toks, causal = plan.dense[0]
    assert (ks, ke, e0, causal) == (0, 512, 0, False) and toks.tolist() == list(range(264))
    assert not build_plan(rows, np.arange(3), seq, ext, start, 3, 3, 2, dense_min_rows=3 * 88 * 3 + 1).dense
    # a member whose new tokens start inside the prefix would need a mask: never dense
    plan = build_plan(rows, np.arange(3), seq, np.array([100, 88, 88]), np.array([0, 100, 188]), 3, 3, 2,
                      dense_min_rows=1)
    assert not any(not causal for *_, causal in plan.dense)


def test_causal_dense_blocks_for_prompts_with_nothing_cached(monkeypatch):
    """A request's own keys that are exactly its new tokens go to flash attention, causal
    (the backend's AMX check is defeated so that bf16 pools take this path too)."""
    monkeypatch.setattr(cpu_backend, "DENSE_MIN_ROWS", 1)
    monkeypatch.setattr(cpu_backend, "AMX_BF16", -99)
    for dtype in (torch.float32, torch.bfloat16):
        pool, batch, q = make_case(23, ForwardMode.EXTEND, 9, 3, 64, dtype, False, n_req=12)
        out, plan = run_cpu(pool, batch, q)
        ref = reference(q, pool, batch, 0.125)
        check(out, ref, dtype)
        squares = [i for i, p in enumerate(batch.extend_prefix_lens_cpu) if p == 0]
        assert sum(causal for *_, causal in plan.dense) == len(squares) > 0


def test_with_amx_a_bf16_prompts_own_block_stays_in_the_kernel(monkeypatch):
    """Where the kernel runs AMX blocks on a bf16 pool, own causal blocks stay in the kernel
    (faster there) while shared prefixes still go to flash; an fp32 pool keeps both."""
    monkeypatch.setattr(cpu_backend, "DENSE_MIN_ROWS", 1)
    amx = int(torch.ops.radixserve_cpu.attention_bf16_mode(-1)) == cpu_backend.AMX_BF16
    for dtype in (torch.float32, torch.bfloat16):
        pool, batch, q = make_case(23, ForwardMode.EXTEND, 9, 3, 64, dtype, False, n_req=12)
        out, plan = run_cpu(pool, batch, q)
        check(out, reference(q, pool, batch, 0.125), dtype)
        causal = sum(c for *_, c in plan.dense)
        assert causal == 0 if (amx and dtype == torch.bfloat16) else causal > 0


def test_plan_covers_every_token_and_reads_shared_prefix_once():
    seq = np.array([600, 600, 600, 80])
    rows = np.zeros((4, 600), dtype=np.int32)
    rows[:3, :512] = np.arange(1, 513)
    rows[:3, 512:] = np.arange(1000, 1000 + 3 * 88).reshape(3, 88)
    rows[3, :80] = np.arange(5000, 5080)
    ext = np.array([1, 1, 1, 1])
    plan = build_plan(rows, np.arange(4), seq, ext, np.arange(4), 3, 3, 2)
    tasks = plan.tasks.numpy()
    assert plan.num_shared_groups == 1
    shared = [t for t in tasks if t[2] - t[1] == 512]
    assert len(shared) == 1 and shared[0][4] - shared[0][3] == 3  # one task, three members' tokens
    assert (np.diff(plan.tok_ptr.numpy()) >= 1).all()
    assert sorted(plan.entry_tok.tolist()) == [0, 0, 1, 1, 2, 2, 3]  # prefix + own; one for the loner


def test_registry_auto_picks_cpu_and_fp16_falls_back():
    pool = KVPool(16, 1, 1, 8, torch.float32)
    assert isinstance(create_attention_backend("auto", pool, torch.device("cpu")), CpuBackend)
    half = KVPool(16, 1, 1, 8, torch.float16)
    assert isinstance(create_attention_backend("auto", half, torch.device("cpu")), TorchNativeBackend)
    with pytest.raises(RuntimeError, match="attention_backend"):
        CpuBackend(half)


def test_build_failure_falls_back_with_one_warning(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("RADIXSERVE_CACHE", str(tmp_path / "cache"))
    cpu_native.reset_for_tests()
    try:
        with caplog.at_level(logging.WARNING, logger="radixserve.kernels.cpu_native"):
            pool = KVPool(16, 1, 1, 8, torch.float32)
            assert isinstance(create_attention_backend("auto", pool, torch.device("cpu")), TorchNativeBackend)
            assert isinstance(create_attention_backend("auto", pool, torch.device("cpu")), TorchNativeBackend)
            assert not cpu_backend.available(pool)
        warnings = [r for r in caplog.records if "unavailable" in r.getMessage()]
        assert len(warnings) == 1 and "no-such-compiler" in warnings[0].getMessage()
    finally:
        cpu_native.reset_for_tests()
    monkeypatch.undo()
    assert cpu_native.load(), "with the compiler back, the cached build loads again"


def test_failing_compile_reports_the_compiler_error(monkeypatch, tmp_path):
    bad = tmp_path / "cxx"
    bad.write_text("#!/bin/sh\necho 'fake compiler 1.0'\n[ \"$1\" = --version ] && exit 0\necho boom >&2\nexit 3\n")
    bad.chmod(0o755)
    monkeypatch.setenv("CXX", str(bad))
    monkeypatch.setenv("RADIXSERVE_CACHE", str(tmp_path / "cache"))
    cpu_native.reset_for_tests()
    try:
        assert not cpu_native.load()
        assert "boom" in cpu_native._state["error"]
    finally:
        cpu_native.reset_for_tests()


# key counts around the 16-key halves and 32-key tiles, one key, nothing cached; new-token
# counts whose query rows (x 3 or x 8 heads per KV head) fill AMX blocks of 16 partly
EDGE_PREFIX = [0, 0, 14, 15, 16, 31, 32, 33, 47, 64, 95, 130]
EDGE_NEW = [1, 5, 1, 2, 1, 6, 1, 17, 1, 43, 3, 1]


BF16_PATHS = [0, 1, (1, True), 2, (2, True)]
BF16_IDS = ["fp32tiles", "avx512", "avx512dot", "amx", "amxdot"]


@pytest.mark.parametrize("path", BF16_PATHS, ids=BF16_IDS)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("heads,kv_heads", [(9, 3), (8, 1)], ids=["gqa3", "gqa8"])
@pytest.mark.parametrize("shared", [False, True], ids=["unshared", "shared"])
def test_bf16_paths_on_tile_edges(bf16_mode, path, d, heads, kv_heads, shared):
    """Every bf16-pool path against the fp64 reference on key counts that end inside a tile,
    a single key, prefix 0, and AMX row blocks with a remainder."""
    bf16_mode(path)
    pool, batch, q = make_lengths_case(EDGE_PREFIX, EDGE_NEW, heads, kv_heads, d, torch.bfloat16, seed=d + heads,
                                       shared_prefix=32 if shared else 0)
    out, plan = run_cpu(pool, batch, q)
    assert (plan.num_shared_groups > 0) == shared
    ref = reference(q, pool, batch, d ** -0.5)
    err = (out.double() - ref).abs().max().item()
    assert err <= 1e-2, f"max abs error {err:.3g}: well inside the bf16 tolerance expected"
    # decode alone (3 or 8 query rows per task, the unshared-decode shape)
    dec = [1] * len(EDGE_PREFIX)
    pool, batch, q = make_lengths_case([p + 1 for p in EDGE_PREFIX], dec, heads, kv_heads, d, torch.bfloat16,
                                       seed=7 + d, shared_prefix=32 if shared else 0)
    out, _ = run_cpu(pool, batch, q)
    check(out, reference(q, pool, batch, d ** -0.5), torch.bfloat16)


@pytest.mark.parametrize("path", BF16_PATHS, ids=BF16_IDS)
def test_bf16_paths_agree_and_a_broken_mask_fails(bf16_mode, path):
    """The bf16 paths agree with one another to bf16 rounding, and the reference check catches
    an off-by-one causal mask on each of them."""
    pool, batch, q = make_case(5, ForwardMode.EXTEND, 9, 3, 64, torch.bfloat16, True)
    ref = reference(q, pool, batch, 0.125)
    bf16_mode(path)  # skips an unavailable path
    bf16_mode(0)
    base, plan = run_cpu(pool, batch, q)
    bf16_mode(path)
    torch.ops.radixserve_cpu.attention_bf16_dot(int(DOT["on"]))  # the calls below use the kernel's setting
    out = cpu_native.paged_attention(q, pool.k_buffer[0], pool.v_buffer[0], batch.req_to_token, plan,
                                     batch.positions, 0.125, torch.empty_like(q))
    check(out, ref, torch.bfloat16)
    assert (out.double() - base.double()).abs().max().item() <= 1.6e-2
    leaky = batch.positions + 1
    bad = cpu_native.paged_attention(q, pool.k_buffer[0], pool.v_buffer[0], batch.req_to_token, plan, leaky,
                                     0.125, torch.empty_like(q))
    with pytest.raises(AssertionError):
        check(bad, ref, torch.bfloat16)
