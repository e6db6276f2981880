"""``dtype="auto"`` and ``quantization="auto"`` on the CPU are chosen by measurement
(radixserve/worker/tuning/kernel_timing.py, numerics_choice.py, quant_accuracy.py): the fastest path on
the model's shapes whose accuracy bar holds, cached per machine, overridden by explicit settings.
Timers and accuracy checks are injected, so these tests check the logic, never the speed."""
from __future__ import annotations

import argparse
import json
from types import SimpleNamespace

import pytest
import torch

from radixserve.config import ModelConfig
from radixserve.model.quant import packed as packed_linear
from radixserve.worker.tuning import quant_accuracy
from radixserve.worker.tuning.kernel_timing import DENSE, PACKED, PATHS, cache_key, linear_shapes, measured_timings, \
    packed_paths, time_path
from radixserve.worker.tuning.numerics_choice import Numerics, candidates, choose, dense_kernel, resolve_numerics

SHAPES = ((8, 16), (16, 8))
MS = (1, 64, 1024)
CONFIG = SimpleNamespace(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)
CPU = torch.device("cpu")


def table(**per_path: tuple[float, float, float]) -> dict[str, dict[int, float]]:
    return {p: dict(zip(MS, v)) for p, v in per_path.items()}


def fake_timer(t: dict, calls: list):
    def timer(path, shapes, ms):
        calls.append(path)
        return {m: t[path][m] for m in ms}
    return timer


def never(method):  # a verify that must not be called
    raise AssertionError(f"verified {method}")


@pytest.mark.parametrize("fp32,bf16,want", [((1, 2, 3), (1, 1, 1), torch.bfloat16),
                                            ((1, 1, 1), (1, 2, 3), torch.float32),
                                            ((1, 1, 1), (1, 1, 1), torch.float32)])
def test_dense_choice_is_the_faster_and_keeps_fp32_on_a_tie(fp32, bf16, want):
    got, rates = choose(table(float32=fp32, bfloat16=bf16), never)
    assert got == Numerics(want) and rates == {}


def test_a_quantized_kernel_runs_up_to_the_last_m_where_it_is_clearly_faster():
    t = table(float32=(5, 50, 500), bfloat16=(4, 10, 100), int8=(1, 20, 900), int4=(2, 5, 50))
    # int4 is faster at every M: alone (no dense weights kept); int8 only at M=1: a hybrid
    assert candidates(t) == [(57, Numerics(torch.bfloat16, "int4")), (111, Numerics(torch.bfloat16, "int8", 1)),
                             (114, Numerics(torch.bfloat16))]
    # 3.7 against 4 saves under MARGIN at M=1: int4 is not faster at the smallest M, so it is out
    t["int4"] = {1: 3.7, 64: 5, 1024: 50}
    assert [c for _, c in candidates(t)] == [Numerics(torch.bfloat16, "int8", 1), Numerics(torch.bfloat16)]


def test_on_an_fp32_machine_a_quantized_path_competes_only_as_a_whole():
    t = table(float32=(1, 10, 100), bfloat16=(5, 50, 500), int8=(0.5, 50, 500), int4=(0.5, 5, 50))
    assert [c for _, c in candidates(t)] == [Numerics(torch.bfloat16, "int4"), Numerics(torch.float32)]


def test_auto_refuses_a_quantized_path_whose_bar_fails():
    t = table(float32=(5, 50, 500), bfloat16=(4, 10, 100), int8=(1, 5, 50), int4=(2, 6, 60))
    checked = []

    def verify(rates):
        def run(method):
            checked.append(method)
            return rates[method]
        return run

    got, rates = choose(t, verify({"int8": (0.90, 700), "int4": (0.99, 700)}))
    assert got == Numerics(torch.bfloat16, "int4") and checked == ["int8", "int4"]
    assert rates == {"int8": (0.90, 700), "int4": (0.99, 700)}
    checked.clear()  # nothing passes: the dense dtype, never an unverified quantization
    assert choose(t, verify({"int8": (0.96, 700), "int4": (0.972, 700)}))[0] == Numerics(torch.bfloat16)
    assert checked == ["int8", "int4"]
    checked.clear()  # a dense path faster than every quantized one: nothing is checked
    slow_int8 = table(float32=(1, 1, 1), bfloat16=(2, 2, 2), int8=(3, 3, 3))
    assert choose(slow_int8, verify({}))[0] == Numerics(torch.float32)
    assert checked == []


def test_packed_dense_weights_must_win_at_decode_sizes_and_not_lose_at_prefill_sizes():
    base = dict(float32=(5, 50, 500), bfloat16=(4, 40, 100))
    assert dense_kernel(table(**base), "bfloat16") == ({1: 4, 64: 40, 1024: 100}, False)  # nothing to compare
    # saves 30% at M <= 64 and costs 5% at M = 1024: packed
    assert dense_kernel(table(**base, **{"bfloat16+packed": (3, 28, 105)}), "bfloat16")[1]
    # costs 12% at M = 1024, within a busy machine's timing noise at prefill sizes: still packed
    assert dense_kernel(table(**base, **{"bfloat16+packed": (3, 28, 112)}), "bfloat16")[1]
    # saves at M <= 64 but costs 20% at M = 1024: plain
    assert not dense_kernel(table(**base, **{"bfloat16+packed": (3, 28, 120)}), "bfloat16")[1]
    # saves only 5% at M <= 64, even if much faster at M = 1024: plain (the small-M sum decides)
    assert not dense_kernel(table(**base, **{"bfloat16+packed": (4, 38, 50)}), "bfloat16")[1]
    # a packed kernel can make bf16 the dense choice, and quantized paths compete with it
    t = table(float32=(3, 30, 300), bfloat16=(4, 40, 400), **{"bfloat16+packed": (2, 20, 290)},
              int8=(1, 30, 900))
    assert candidates(t) == [(311, Numerics(torch.bfloat16, "int8", 1, True)),
                             (312, Numerics(torch.bfloat16, packed=True))]
    assert Numerics(torch.bfloat16, "int8", 1, True).describe() == "bfloat16 (packed) + int8 at <= 1 rows"


def test_the_bar_is_a_confidence_bound():
    assert quant_accuracy.passes(0.99, 700) and not quant_accuracy.passes(0.972, 700)
    assert not quant_accuracy.passes(1.0, 10)  # too few positions to know
    assert quant_accuracy.lower_bound(0.98, 700) < 0.98 < quant_accuracy.lower_bound(0.98, 10 ** 7) + 1e-3


def test_timings_are_measured_once_then_read_from_the_cache(tmp_path):
    path = str(tmp_path / "sub" / "kernel_timings.json")
    t = table(float32=(1, 2, 3), bfloat16=(4, 5, 6), int8=(7, 8, 9), w8a8=(1, 1, 1), int4=(2, 2, 2))
    calls: list = []
    got, cached = measured_timings(SHAPES, DENSE, path, fake_timer(t, calls), MS)
    assert got == {p: t[p] for p in DENSE} and not cached and calls == list(DENSE)
    calls.clear()
    got, cached = measured_timings(SHAPES, PATHS, path, fake_timer(t, calls), MS)
    assert got == t and not cached and calls == ["int8", "w8a8", "int4"]  # only what was missing
    calls.clear()
    assert measured_timings(SHAPES, PATHS, path, fake_timer(t, calls), MS) == (t, True) and calls == []
    entry = json.load(open(path))[cache_key(SHAPES, MS)]
    assert entry["timings"]["int8"] == {"1": 7, "64": 8, "1024": 9}
    # another model's shapes are measured on their own, next to the first entry
    measured_timings(((4, 4),), DENSE, path, fake_timer(t, calls), MS)
    assert len(json.load(open(path))) == 2


def test_a_corrupt_or_unwritable_cache_never_breaks_loading(tmp_path):
    bad = tmp_path / "kernel_timings.json"
    bad.write_text("{not json")
    t = table(float32=(1, 2, 3), bfloat16=(4, 5, 6))
    calls: list = []
    assert measured_timings(SHAPES, DENSE, str(bad), fake_timer(t, calls), MS)[0] == t and calls
    bad.write_text(json.dumps({cache_key(SHAPES, MS): {"timings": {"float32": {"1": "x"}}}}))  # measured again
    calls.clear()
    assert measured_timings(SHAPES, DENSE, str(bad), fake_timer(t, calls), MS)[0] == t and calls == list(DENSE)
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert measured_timings(SHAPES, DENSE, str(blocker / "x.json"), fake_timer(t, []), MS)[0] == t
    assert measured_timings(SHAPES, DENSE, None, fake_timer(t, []), MS)[0] == t


def test_the_key_names_the_machine_torch_threads_shapes_and_ms():
    key = cache_key(SHAPES, MS)
    assert torch.__version__ in key and f"{torch.get_num_threads()} threads" in key and str(list(SHAPES)) in key
    assert str(list(MS)) in key and cache_key(((1, 2),), MS) != key and cache_key(SHAPES, (1,)) != key


def test_the_real_timer_runs_every_path():
    shapes = linear_shapes(CONFIG)
    assert shapes == ((64, 128), (64, 64), (64, 256), (128, 64))
    for path in PATHS + packed_paths():
        got = time_path(path, ((32, 16), (24, 16)), ms=(1, 3), reps=1)  # K=24: int8/int4 keep it dense
        assert set(got) == {1, 3} and all(v > 0 for v in got.values())


def test_verified_agreement_is_measured_once_per_model_and_method(tmp_path, tiny_dir):
    path = str(tmp_path / "quant_accuracy.json")
    calls = []

    def measure(hf_dir, config, method):
        calls.append(method)
        return 0.975, 600

    for _ in range(2):
        assert quant_accuracy.verified_agreement(tiny_dir, None, "int8", path, measure) == (0.975, 600)
    assert calls == ["int8"]
    assert quant_accuracy.verified_agreement(tiny_dir, None, "int4", path, measure) == (0.975, 600)
    assert calls == ["int8", "int4"]


def _packs(monkeypatch, dtypes: tuple) -> None:
    """Pin what this CPU can pack: the decision logic is under test, not the machine (oneDNN's
    bf16 packing needs AVX-512 or AVX-NE-CONVERT; an AVX2-only CPU packs fp32 only)."""
    monkeypatch.setattr(packed_linear, "available", lambda d: d in dtypes)


@pytest.mark.parametrize("packable", [(torch.float32, torch.bfloat16), (torch.float32,)], ids=["both", "fp32-only"])
def test_resolve_numerics_measures_only_when_both_are_auto(monkeypatch, tmp_path, packable):
    from radixserve.model.quant import blocked

    monkeypatch.setenv("RADIXSERVE_CACHE", str(tmp_path))
    monkeypatch.setattr(blocked, "exact_available", lambda n, k: False)  # (int4+float32: its own test)
    _packs(monkeypatch, packable)
    ms = (1, 2, 4, 8, 16, 64, 256, 1024)
    t = {p: {m: 1.0 for m in ms} for p in PATHS + packed_paths()}
    t["bfloat16"] = {m: 0.5 for m in ms}
    if "bfloat16+packed" in t:  # packed saves at decode sizes, costs nothing at prefill sizes
        t["bfloat16+packed"] = {m: 0.3 if m <= 64 else 0.5 for m in ms}
    t["int8"] = {**t["bfloat16"], 1: 0.1, 2: 0.2}
    packs = "bfloat16+packed" in t
    calls: list = []
    checked: list = []

    def resolve(**kw):
        cfg = ModelConfig(**kw)
        return resolve_numerics(cfg, CPU, CONFIG, "unused", fake_timer(t, calls),
                                lambda m: checked.append(m) or (0.99, 700))

    # explicit numerics are never measured or verified; only their dense kernel is timed, once
    assert resolve(dtype="float32") == Numerics(torch.float32)
    assert calls == (["float32", "float32+packed"] if "float32+packed" in t else [])
    calls.clear()
    assert resolve(dtype="float32") == Numerics(torch.float32) and calls == []  # cached
    assert resolve(dtype="bfloat16", quantization="none") == Numerics(torch.bfloat16, packed=packs)
    assert calls == (["bfloat16", "bfloat16+packed"] if packs else [])
    assert resolve(quantization="int4") == Numerics(torch.bfloat16, "int4", packed=packs)
    assert resolve(dtype="float32", quantization="w8a8") == Numerics(torch.float32, "w8a8")
    assert checked == [] and all(c in DENSE or c.endswith(PACKED) for c in calls)
    calls.clear()
    assert resolve(quantization="none") == Numerics(torch.bfloat16, packed=packs) and checked == []
    assert calls == ([] if packs else ["bfloat16"])  # (bf16's plain timing came with its packed one above)
    calls.clear()
    # int8 (0.1, 0.2, 0.5) is clearly faster than bf16 (packed 0.3 or plain 0.5) up to M = 2 only
    assert resolve() == Numerics(torch.bfloat16, "int8", 2, packs) and checked == ["int8"]
    assert calls == ["int8", "w8a8", "int4"]
    assert (tmp_path / "kernel_timings.json").exists()
    cuda = torch.device("cuda")
    assert resolve_numerics(ModelConfig(), cuda, CONFIG, "unused", never, never) == Numerics(torch.bfloat16)
    with pytest.raises(ValueError, match="^quantization: int8 is implemented for the CPU only"):
        resolve_numerics(ModelConfig(quantization="int8"), cuda, CONFIG, "unused", never, never)
    with pytest.raises(ValueError, match="^dtype: must be one of auto, float32, bfloat16 \\(got 'int3'\\)"):
        resolve(dtype="int3")


def test_a_pinned_dense_kernel_overrides_the_timings():
    t = table(float32=(5, 50, 500), bfloat16=(4, 40, 100), **{"bfloat16+packed": (3, 28, 105),
                                                               "float32+packed": (9, 90, 900)})
    assert dense_kernel(t, "bfloat16") == (t["bfloat16+packed"], True)  # measured: packed wins
    assert dense_kernel(t, "bfloat16", "plain") == (t["bfloat16"], False)
    assert dense_kernel(t, "float32") == (t["float32"], False)  # measured: plain wins
    assert dense_kernel(t, "float32", "packed") == (t["float32+packed"], True)
    assert [c for _, c in candidates(t, "plain")] == [Numerics(torch.bfloat16)]
    assert [c for _, c in candidates(t, "packed")] == [Numerics(torch.bfloat16, packed=True)]


@pytest.mark.parametrize("dtype,quantization", [("float32", "auto"), ("bfloat16", "none"), ("auto", "int8"),
                                                ("auto", "none"), ("auto", "auto")])
def test_resolve_numerics_takes_a_pinned_dense_kernel_as_given(monkeypatch, tmp_path, dtype, quantization):
    """Whatever the timings say (here packing is much faster for both dtypes), a pin decides,
    and a pinned kernel's variants are never timed; ``auto`` still chooses everything else."""
    from radixserve.model.quant import blocked

    monkeypatch.setenv("RADIXSERVE_CACHE", str(tmp_path))
    monkeypatch.setattr(blocked, "exact_available", lambda n, k: False)
    _packs(monkeypatch, (torch.float32, torch.bfloat16))
    ms = (1, 2, 4, 8, 16, 64, 256, 1024)
    t = {p: {m: 1.0 for m in ms} for p in PATHS + packed_paths()}
    t.update({p: {m: 0.1 for m in ms} for p in packed_paths()})
    for pin in ("plain", "packed", "auto"):
        calls: list = []
        got = resolve_numerics(ModelConfig(dtype=dtype, quantization=quantization, dense_kernel=pin), CPU, CONFIG,
                               "unused", fake_timer(t, calls), never)
        assert got.packed == (pin != "plain"), pin
        if pin == "plain":
            assert not any(c.endswith(PACKED) for c in calls)
        if pin != "auto" and (dtype != "auto" or quantization == "int8"):
            assert calls == [], "explicit numerics with a pinned kernel measure nothing"


def test_config_and_cli_validate_dense_kernel():
    from radixserve import cli
    from radixserve.config import EngineConfig

    assert ModelConfig().dense_kernel == "auto"
    with pytest.raises(ValueError, match="^dense_kernel: unknown kernel 'blocked' \\(auto, plain, packed\\)"):
        ModelConfig(dense_kernel="blocked")
    assert EngineConfig.from_kwargs(dense_kernel="plain").model.dense_kernel == "plain"
    parser = argparse.ArgumentParser()
    cli._engine_parser(parser)
    assert cli.engine_config_from_args(parser.parse_args(["--dense-kernel", "packed"])).model.dense_kernel == "packed"
    assert cli.engine_config_from_args(parser.parse_args([])).model.dense_kernel == "auto"
    assert "oneDNN prepacked" in parser.format_help()  # the flag's help says what each value does
    with pytest.raises(SystemExit):
        parser.parse_args(["--dense-kernel", "blocked"])
    with pytest.raises(ValueError, match="^dense_kernel: packed is implemented for the CPU only"):
        resolve_numerics(ModelConfig(dense_kernel="packed"), torch.device("cuda"), CONFIG, "unused", never, never)


def test_a_cpu_that_cannot_pack_bf16_never_gets_it(monkeypatch, tmp_path):
    """An AVX2-only CPU: pinning ``packed`` with bf16 is refused naming the dtype, and ``auto``
    neither times nor picks bf16's packed path, however fast the (fake) timings would make it."""
    from radixserve.model.quant import blocked

    monkeypatch.setenv("RADIXSERVE_CACHE", str(tmp_path))
    monkeypatch.setattr(blocked, "exact_available", lambda n, k: False)  # (int4+float32: its own test)
    _packs(monkeypatch, (torch.float32,))
    assert packed_paths() == ("float32" + PACKED,)
    with pytest.raises(ValueError, match="no oneDNN packed linear for torch.bfloat16"):
        resolve_numerics(ModelConfig(dtype="bfloat16", dense_kernel="packed"), CPU, CONFIG, "unused",
                         fake_timer({}, []), never)
    ms = (1, 2, 4, 8, 16, 64, 256, 1024)
    t = {p: {m: 1.0 for m in ms} for p in PATHS + ("float32" + PACKED, "bfloat16" + PACKED)}
    t["bfloat16" + PACKED] = {m: 0.01 for m in ms}
    calls: list = []
    got = resolve_numerics(ModelConfig(), CPU, CONFIG, "unused", fake_timer(t, calls), never)
    assert not (got.dtype == torch.bfloat16 and got.packed) and "bfloat16" + PACKED not in calls


def test_the_packing_probe_matches_what_onednn_does():
    """``available`` packs and runs one tiny weight: where it says yes, a real layer packs and
    runs; where it says no, oneDNN refuses (never a crash at model load)."""
    for dtype in (torch.float32, torch.bfloat16):
        packed_linear.available.cache_clear()
        w = torch.randn(32, 16).to(dtype)
        if packed_linear.available(dtype):
            y = packed_linear.PackedLinear(w, None)(torch.randn(3, 16).to(dtype))
            assert y.shape == (3, 32)
        else:
            with pytest.raises(RuntimeError):
                packed_linear.PackedLinear(w, None)(torch.randn(3, 16).to(dtype))


@pytest.mark.parametrize("pin", ["auto", "plain"])
def test_float32_int4_runs_the_exact_kernel_up_to_the_last_m_where_it_is_faster(monkeypatch, tmp_path, pin):
    """``--dtype float32 --quantization int4``: int4 weights with float32 arithmetic are timed
    against the dense float32 kernel (the faster of plain and packed, unless pinned); the dense
    weights serve the calls above the last probe M before the first one the exact kernel loses;
    where it loses everywhere or wins everywhere, int4 runs every call, as asked."""
    from radixserve.model.quant import blocked
    from radixserve.worker.tuning.kernel_timing import INT4_F32

    monkeypatch.setenv("RADIXSERVE_CACHE", str(tmp_path))
    monkeypatch.setattr(blocked, "exact_available", lambda n, k: True)
    _packs(monkeypatch, (torch.float32,))
    ms = (1, 2, 4, 8, 16, 64, 256, 1024)
    cases = [({1: 0.2, 2: 0.3, 4: 0.5, 8: 0.8, 16: 1.1}, 8),  # packed (1.0) is faster from 16 rows
             ({}, None), ({m: 0.1 for m in ms}, None)]
    for i, (faster, want) in enumerate(cases):
        monkeypatch.setenv("RADIXSERVE_CACHE", str(tmp_path / str(i)))
        t = {"float32": {m: 2.0 for m in ms}, "float32+packed": {m: 1.0 for m in ms},
             INT4_F32: {m: faster.get(m, 3.0) for m in ms}}
        calls: list = []
        got = resolve_numerics(ModelConfig(dtype="float32", quantization="int4", dense_kernel=pin), CPU, CONFIG,
                               "unused", fake_timer(t, calls), never)
        if pin == "plain":  # plain's 2.0: the exact kernel wins up to 16 rows in the first case
            want = 16 if i == 0 else want
        assert got == Numerics(torch.float32, "int4", want, pin == "auto"), (i, got)
        assert INT4_F32 in calls and ("float32+packed" in calls) == (pin == "auto")
    monkeypatch.setattr(blocked, "exact_available", lambda n, k: False)  # no exact kernel: as before
    monkeypatch.setenv("RADIXSERVE_CACHE", str(tmp_path / "none"))
    calls = []
    got = resolve_numerics(ModelConfig(dtype="float32", quantization="int4", dense_kernel=pin), CPU, CONFIG,
                           "unused", fake_timer(t, calls), never)
    assert got == Numerics(torch.float32, "int4", packed=pin == "auto") and INT4_F32 not in calls


def test_auto_on_a_float32_machine_takes_int4_on_float32_activations_where_verified(monkeypatch, tmp_path):
    """Where fp32 is the dense choice, int4 weights with float32 arithmetic compete as a hybrid
    (the bf16 methods, slow here, compete as a whole and lose); it is taken only when its own
    accuracy check ("int4+float32", loaded as it serves) passes the bar."""
    from radixserve.model.quant import blocked
    from radixserve.worker.tuning.kernel_timing import INT4_F32

    monkeypatch.setattr(blocked, "exact_available", lambda n, k: True)
    _packs(monkeypatch, (torch.float32,))
    ms = (1, 2, 4, 8, 16, 64, 256, 1024)
    t = {p: {m: 5.0 for m in ms} for p in PATHS}  # bf16 and its methods: slow
    t["float32"] = {m: 1.0 for m in ms}
    t["float32+packed"] = {m: 2.0 for m in ms}
    t[INT4_F32] = {m: 0.4 if m <= 8 else 1.5 for m in ms}
    for rate, want in [((0.999, 700), Numerics(torch.float32, "int4", 8)), ((0.95, 700), Numerics(torch.float32))]:
        monkeypatch.setenv("RADIXSERVE_CACHE", str(tmp_path / str(rate[0])))
        calls: list = []
        checked: list = []
        got = resolve_numerics(ModelConfig(), CPU, CONFIG, "unused", fake_timer(t, calls),
                               lambda m: checked.append(m) or rate)
        assert got == want and checked == [INT4_F32] and INT4_F32 in calls
