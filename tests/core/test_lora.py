"""Multi-LoRA through the Engine (radixserve/lora/, radixserve/worker/lora/): fp32 greedy tokens and
logprobs equal PEFT's merged model for adapters of ranks 4 and 8 on q/k/v/o and the MLP; a batch
mixing adapters and the base equals each run alone; adapters never share cached KV; adapters load
and unload while serving; what cannot be served is refused naming the field.  The allocator's
invariants are checked after every scenario."""
from __future__ import annotations

import pytest
import torch

from tests.helpers.lora_adapters import ALL as ALL_MODULES, greedy, make_adapter, merged_model
from tests.helpers.models import make_engine

PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8], list(range(40, 71)), [9, 8, 7, 100, 200, 300]]
N = 8
GREEDY = {"max_new_tokens": N, "temperature": 0}


@pytest.fixture(scope="module")
def adapters(tmp_path_factory, tiny_dir):
    root = tmp_path_factory.mktemp("lora")
    return {
        "a": make_adapter(tiny_dir, str(root / "a"), 4, seed=1, std=0.5),  # rank 4, every module
        "b": make_adapter(tiny_dir, str(root / "b"), 8, seed=2, std=0.5),  # rank 8, every module
        "c": make_adapter(tiny_dir, str(root / "c"), 8, seed=3, std=0.5, targets=("q_proj", "v_proj", "down_proj"),
                          rslora=True),
        "big": make_adapter(tiny_dir, str(root / "big"), 16, seed=4, std=0.5),
    }


@pytest.fixture(scope="module")
def oracle(adapters, tiny_dir, tiny_hf):
    """(tokens, logprobs) of each prompt under each adapter (None: the base), by PEFT's merged model."""
    models = {None: tiny_hf, **{k: merged_model(tiny_dir, adapters[k]) for k in ("a", "b", "c")}}
    return {(name, i): greedy(m, p, N) for name, m in models.items() for i, p in enumerate(PROMPTS)}


@pytest.fixture(scope="module")
def engine(adapters, tiny_dir):
    eng = make_engine(tiny_dir, lora_paths=tuple(f"{k}={adapters[k]}" for k in ("a", "b", "c")),
                      max_loras_per_batch=2, max_lora_rank=8)
    yield eng
    eng.shutdown()


def _run(eng, names, prompts=None):
    prompts = prompts or PROMPTS
    outs = eng.generate(input_ids=prompts, sampling_params=GREEDY, lora_path=list(names), return_logprob=True)
    return [(o["output_ids"], [lp[0] for lp in o["meta_info"]["output_token_logprobs"]]) for o in outs]


def _close(got, want):
    assert got[0] == want[0]
    assert max(abs(x - y) for x, y in zip(got[1], want[1])) < 1e-4


@pytest.mark.parametrize("sgmv", [True, False], ids=["sgmv", "stacked-gemm"])
@pytest.mark.parametrize("name", [None, "a", "b", "c"])
def test_each_adapter_equals_peft_merged_model(engine, oracle, name, sgmv):
    engine.runner.lora.sgmv = sgmv  # each path of worker/lora/step.py on purpose
    try:
        for i, got in enumerate(_run(engine, [name] * len(PROMPTS))):
            _close(got, oracle[name, i])
    finally:
        engine.runner.lora.sgmv = None
    engine.check_invariants()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_segmented_kernel_equals_the_stacked_gemms(engine, dtype):
    """Random rows over three slots and the base, every fused module: the native kernel and the
    stacked GEMMs agree (fp32: to rounding; bf16: to bf16's)."""
    from radixserve.worker.lora.slots import LoRASlots
    from radixserve.worker.lora.step import LoRAStep

    model = engine.runner.model
    slots = LoRASlots(model, 3, 8, frozenset(ALL_MODULES), dtype, torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    for key in slots.a:  # random A; B random within each part's own columns
        slots.a[key].copy_(torch.randn(slots.a[key].shape, generator=g))
        _, outs = slots.geometry[key[1]]
        b = slots.b[key].view(3, len(outs), 8, -1)
        col = 0
        for p, width in enumerate(outs):
            b[:, p, :, col:col + width] = torch.randn(b[:, p, :, col:col + width].shape, generator=g)
            col += width
    row_slot = torch.tensor([2, -1, 0, 0, 1, -1, 2, 2, 1, 0, -1])
    for module in slots.modules:
        fan_in, outs = slots.geometry[module]
        x = torch.randn(len(row_slot), fan_in, generator=g).to(dtype)
        y = torch.randn(len(row_slot), sum(outs), generator=g).to(dtype)
        fast, ref = y.clone(), y.clone()
        LoRAStep(slots, row_slot, sgmv=True).add(0, module, x, fast)
        LoRAStep(slots, row_slot, sgmv=False).add(0, module, x, ref)
        assert torch.equal(fast[row_slot < 0], y[row_slot < 0])  # base rows untouched
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(fast.float(), ref.float(), rtol=tol, atol=tol * ref.float().abs().max().item())


def test_adapters_change_the_output(oracle):
    assert len({tuple(oracle[name, 1][0]) for name in (None, "a", "b", "c")}) == 4


def test_a_mixed_batch_equals_each_run_alone(engine, oracle):
    # three adapters and the base in one batch, two slots: the third adapter waits for a slot
    names = ["a", None, "b", "c", "a", None]
    prompts = [PROMPTS[i % 3] for i in range(len(names))]
    for name, p, got in zip(names, prompts, _run(engine, names, prompts)):
        _close(got, oracle[name, PROMPTS.index(p)])
    engine.check_invariants()


def test_the_module_path_equals_peft(adapters, tiny_dir, oracle):
    """torch_native attention: the layers' own forward (not the native layer loop) adds the deltas."""
    eng = make_engine(tiny_dir, attention_backend="torch_native", lora_paths=(f"b={adapters['b']}",))
    try:
        for i, got in enumerate(_run(eng, ["b", None, "b"])):
            _close(got, oracle["b" if i != 1 else None, i])
        eng.check_invariants()
    finally:
        eng.shutdown()


def test_adapters_never_share_cached_prefixes(engine):
    engine.flush_cache()
    prompt = list(range(500, 560))
    params = {"max_new_tokens": 2, "temperature": 0}
    engine.generate(input_ids=prompt, sampling_params=params, lora_path="a")
    again_a = engine.generate(input_ids=prompt, sampling_params=params, lora_path="a")
    as_b = engine.generate(input_ids=prompt, sampling_params=params, lora_path="b")
    as_base = engine.generate(input_ids=prompt, sampling_params=params)
    assert again_a["meta_info"]["cached_tokens"] >= len(prompt) - 1
    assert as_b["meta_info"]["cached_tokens"] == 0
    assert as_base["meta_info"]["cached_tokens"] == 0
    salted = engine.generate(input_ids=prompt, sampling_params={**params, "cache_salt": "s"}, lora_path="a")
    assert salted["meta_info"]["cached_tokens"] == 0  # a salt splits an adapter's namespace too
    engine.check_invariants()


def test_load_and_unload_while_serving(engine, adapters, tiny_dir, oracle):
    summary = engine.load_lora_adapter("a2", adapters["a"])
    assert summary["rank"] == 4 and summary["lora_name"] == "a2"
    # the same files under another name: the same tokens, its own cache namespace
    _close(_run(engine, ["a2"], PROMPTS[:1])[0], oracle["a", 0])
    assert {a["lora_name"] for a in engine.lora_adapters()} == {"a", "b", "c", "a2"}
    # unloaded while a request of it runs: it finishes, then the weights go
    fut, _, _ = engine.submit(input_ids=PROMPTS[1], sampling_params={"max_new_tokens": 64, "temperature": 0,
                                                                     "ignore_eos": True}, lora_path="a2")
    out = engine.unload_lora_adapter("a2")
    assert out["requests_in_flight"] == 1
    with pytest.raises(ValueError, match="^lora_path: unknown adapter 'a2'"):
        engine.generate(input_ids=PROMPTS[0], sampling_params=GREEDY, lora_path="a2")
    fut.result(timeout=300)
    assert fut.result()[0]["output_ids"][:N] == oracle["a", 1][0]
    engine.generate(input_ids=PROMPTS[0], sampling_params=GREEDY)  # a step: the deferred unload happens
    slots = engine.runner.lora.slots
    assert not [uid for uid in slots.host if uid.startswith("a2@")]
    engine.check_invariants()


@pytest.mark.parametrize("call,field", [
    (lambda e, d: e.load_lora_adapter("x", "/no/such/dir"), "lora_path"),
    (lambda e, d: e.load_lora_adapter("x", d["big"]), "lora_path"),  # rank 16 > max_lora_rank 8
    (lambda e, d: e.load_lora_adapter("a", d["b"]), "lora_name"),  # the name is taken
    (lambda e, d: e.load_lora_adapter("x@y", d["b"]), "lora_name"),
    (lambda e, d: e.unload_lora_adapter("nope"), "lora_name"),
    (lambda e, d: e.generate(input_ids=[1, 2], sampling_params=GREEDY, lora_path="nope"), "lora_path"),
    (lambda e, d: e.generate(input_ids=[1, 2], sampling_params={**GREEDY, "lora_path": 3}), "sampling_params.lora_path"),
    (lambda e, d: e.generate(input_ids=[[1], [2]], sampling_params=GREEDY, lora_path=["a"]), "lora_path"),
])
def test_bad_adapters_and_names_are_refused_naming_the_field(engine, adapters, call, field):
    with pytest.raises(ValueError, match=f"^{field}: "):
        call(engine, adapters)
    engine.check_invariants()


def test_rank_over_the_limit_and_no_lora_are_refused(adapters, tiny_dir, tiny_engine):
    from radixserve.config import EngineConfig

    with pytest.raises(ValueError, match="^lora_paths: .* rank 16, above max_lora_rank 8"):
        make_engine(tiny_dir, lora_paths=(f"big={adapters['big']}",), max_lora_rank=8)
    with pytest.raises(ValueError, match="^max_lora_rank: required"):
        EngineConfig.from_kwargs(tiny_dir, enable_lora=True)
    with pytest.raises(ValueError, match="^lora_path: LoRA adapters are not enabled"):
        tiny_engine.generate(input_ids=[1, 2], sampling_params=GREEDY, lora_path="a")


def test_slots_are_reused_least_recently_used_first(engine):
    slots = engine.runner.lora.slots
    uids = {a["lora_name"]: f"{a['lora_name']}@{a['fingerprint']}" for a in engine.lora_adapters()}
    slots.assign([uids["a"], uids["b"]])
    slots.assign([uids["b"]])  # a is now the least recently used
    got = slots.assign([uids["c"]])
    assert got[uids["c"]] == slots.slot_of.get(uids["c"]) and uids["a"] not in slots.slot_of
    assert uids["b"] in slots.slot_of
    with pytest.raises(ValueError, match="^max_loras_per_batch"):
        slots.assign([uids["a"], uids["b"], uids["c"]])


def test_the_kernel_on_odd_widths_against_a_plain_reference():
    """K and part widths that are not multiples of the kernel's 16 lanes, blocks of more than 8
    rows of one slot, rows out of order: each row gets exactly its own slot's parts."""
    from radixserve.kernels import cpu_native

    assert cpu_native.load()
    g = torch.Generator().manual_seed(1)
    S, P, R, K, outs = 3, 2, 5, 37, (19, 23)
    N = sum(outs)
    a, b = torch.randn(S * P * R, K, generator=g), torch.zeros(S * P * R, N)
    bv = b.view(S, P, R, N)
    bv[:, 0, :, :19] = torch.randn(S, R, 19, generator=g)
    bv[:, 1, :, 19:] = torch.randn(S, R, 23, generator=g)
    x, y = torch.randn(20, K, generator=g), torch.randn(20, N, generator=g)
    rows = torch.tensor([3, 0, 5, 7, 9, 11, 13, 15, 17, 19, 1, 2, 4, 6, 8, 10, 12])  # slot 2: 10 rows, slot 0: 7
    bounds, slots = torch.tensor([0, 10, 17]), torch.tensor([2, 0])
    want = y.clone()
    for seg, s in enumerate(slots.tolist()):
        for r in rows[bounds[seg]:bounds[seg + 1]].tolist():
            want[r] += b.view(S, P * R, N)[s].t() @ (a.view(S, P * R, K)[s] @ x[r])
    got = y.clone()
    torch.ops.radixserve_cpu.lora_sgmv_(got, x, a, b, rows, bounds, slots, P, R, torch.tensor([0, 19, N]))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
    assert torch.equal(got[[14, 16, 18]], y[[14, 16, 18]])  # rows in no segment


def test_the_layer_stack_adds_the_deltas_as_the_python_loop(engine, monkeypatch):
    """A mixed batch on the kernel path: the native layer stack (set_lora / set_lora_step) runs
    its steps, and gives the tokens of the Python layer loop exactly, its logprobs within 1e-4.

    Not bit for bit: this engine's dense kernels and attention paths are ``auto``'s, timed on the
    machine at hand, and on an AMD EPYC Zen 4 the two paths' logprobs differed in the sixth
    decimal (-1.0927213 against -1.0927191) where an Intel AMX machine gave the same bits; a
    reduction order that differs between the two paths is a rounding, not a wrong delta (a wrong
    delta moves logprobs by far more, and the PEFT oracle above checks each path's values)."""
    from radixserve.model.cpu import layer_stack

    real, ran = layer_stack.run, []

    def spy(model, x, batch, backend, lora=None):
        out = real(model, x, batch, backend, lora)
        ran.append((lora is not None, out is not None))
        return out

    names = ["a", None, "b", "a", None, "b"]
    prompts = [PROMPTS[i % 3] for i in range(len(names))]
    engine.runner.lora.sgmv = True
    try:
        monkeypatch.setattr(layer_stack, "run", spy)
        stacked = _run(engine, names, prompts)
        assert (True, True) in ran, ran  # steps with adapters ran in the stack
        monkeypatch.setattr(layer_stack, "run", lambda *a, **k: None)
        looped = _run(engine, names, prompts)
    finally:
        engine.runner.lora.sgmv = None
    assert len(stacked) == len(looped)
    for got, want in zip(stacked, looped):
        _close(got, want)
    engine.check_invariants()


def test_the_stacked_gemm_path_stays_in_python(engine, monkeypatch):
    """The GEMM path is not the stack's: a step pinned to it runs the Python loop."""
    from radixserve.model.cpu import layer_stack

    real, ran = layer_stack.run, []
    monkeypatch.setattr(layer_stack, "run", lambda m, x, b, be, lora=None: ran.append(lora) or real(m, x, b, be, lora))
    engine.runner.lora.sgmv = False
    try:
        _run(engine, ["a", "b"], PROMPTS[:2])
    finally:
        engine.runner.lora.sgmv = None
    assert any(r is not None and not r.sgmv for r in ran)


def test_the_path_rule_follows_the_timings():
    from radixserve.worker.lora.timing import NO_LIMIT, sgmv_limit

    def t(sgmv, gemm):
        ms = (16, 64, 256, 1024)
        return {"sgmv": dict(zip(ms, sgmv)), "gemm": dict(zip(ms, gemm))}

    assert sgmv_limit(t([1, 2, 4, 8], [2, 3, 5, 9])) == NO_LIMIT  # the kernel always faster
    assert sgmv_limit(t([1, 2, 4, 8], [2, 3, 3, 4])) == 129  # from between 64 and 256 rows
    assert sgmv_limit(t([1, 2, 4, 8], [2, 1, 5, 4])) == 513  # one early win is not a crossover
    assert sgmv_limit(t([2, 2, 4, 8], [1, 1, 3, 4])) == 1  # the GEMMs always faster


def test_the_path_timing_is_measured_once_and_cached(engine, tmp_path, monkeypatch):
    from radixserve.worker.lora import timing

    calls = []
    real = timing.time_paths
    monkeypatch.setattr(timing, "time_paths", lambda slots, ms: calls.append(ms) or real(slots, ms, reps=1))
    path = str(tmp_path / "lora_timings.json")
    slots = engine.runner.lora.slots
    first = timing.measured_limit(slots, path, ms=(4, 32))
    again = timing.measured_limit(slots, path, ms=(4, 32))
    assert calls == [(4, 32)] and first == again  # the second start reads the file
    assert first in (1, 6, timing.NO_LIMIT)
    (tmp_path / "lora_timings.json").write_text("{not json")
    assert timing.measured_limit(slots, path, ms=(4, 32)) in (1, 6, timing.NO_LIMIT) and len(calls) == 2


def test_odd_adapter_files_and_a_compiling_request_are_handled(tmp_path):
    """Found by the server fuzzer (tests/helpers/fuzz_routes.py): a safetensors header length
    past the file was an OverflowError (HTTP 500), a non-numeric ``lora_alpha`` a TypeError in the
    worker; counting an adapter's users raised on a request waiting for its grammar (HTTP 500 on
    /unload_lora_adapter, and a failed step in ``collect``)."""
    import json
    from types import SimpleNamespace

    from radixserve.lora.adapter import read_adapter
    from radixserve.scheduler.scheduler import Scheduler

    for name, cfg, weights in (("garbage", {"r": 4}, b"\xff" * 64),
                               ("alpha", {"r": 4, "lora_alpha": "x"}, None),
                               ("pattern", {"r": 4, "alpha_pattern": {"q_proj": None}}, None)):
        d = tmp_path / name
        d.mkdir()
        (d / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", **cfg}))
        (d / "adapter_model.safetensors").write_bytes(weights or b"\x00" * 8)
        with pytest.raises(ValueError, match="^lora_path: "):
            read_adapter(name, str(d))
    req = SimpleNamespace(lora="a@1")
    sched = SimpleNamespace(running=[req], waiting=[], grammars=SimpleNamespace(waiting=[(req, object())]))
    assert Scheduler.lora_users(sched, "a@1") == 2 and Scheduler.lora_users(sched, "b@2") == 0
