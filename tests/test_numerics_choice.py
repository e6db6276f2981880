"""``dtype="auto"`` on the CPU is chosen by measurement (radixserve/worker/dtype_choice.py): the
faster of fp32 and bf16 on the model's shapes, cached per machine, overridden by an explicit
dtype.  The timer is injected, so these tests check the logic, never the speed."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from radixserve.worker import dtype_choice
from radixserve.worker.dtype_choice import cache_key, choose_cpu_dtype, mlp_shapes, pick, time_matmuls
from radixserve.worker.model_runner import resolve_dtype

SHAPES = ((8, 16), (16, 8))


def fake_timer(times: dict, calls: list):
    def timer(dtype, shapes):
        calls.append((dtype, shapes))
        return times[dtype]
    return timer


@pytest.mark.parametrize("fp32,bf16,want", [(2.0, 1.0, torch.bfloat16), (1.0, 2.0, torch.float32),
                                            (1.0, 1.0, torch.float32)])
def test_pick_takes_the_faster_and_keeps_fp32_on_a_tie(fp32, bf16, want):
    assert pick({"float32": fp32, "bfloat16": bf16}) == want


@pytest.mark.parametrize("times,want", [({torch.float32: 0.5, torch.bfloat16: 0.2}, torch.bfloat16),
                                        ({torch.float32: 0.2, torch.bfloat16: 0.9}, torch.float32)])
def test_measures_once_then_reads_the_cache(tmp_path, times, want):
    path = str(tmp_path / "sub" / "dtype_choice.json")
    calls: list = []
    assert choose_cpu_dtype(SHAPES, path, fake_timer(times, calls)) == want
    assert sorted(str(c[0]) for c in calls) == ["torch.bfloat16", "torch.float32"] and calls[0][1] == SHAPES
    entry = json.load(open(path))[cache_key(SHAPES)]
    assert entry["choice"] == str(want).removeprefix("torch.")
    assert entry["timings"] == {"float32": times[torch.float32], "bfloat16": times[torch.bfloat16]}
    calls.clear()
    assert choose_cpu_dtype(SHAPES, path, fake_timer(times, calls)) == want
    assert calls == []  # the second start reads the cache
    # other shapes (another model) are measured on their own, next to the first entry
    assert choose_cpu_dtype(((4, 4),), path, fake_timer(times, calls)) == want and len(calls) == 2
    assert len(json.load(open(path))) == 2


def test_a_corrupt_or_unwritable_cache_never_breaks_loading(tmp_path):
    bad = tmp_path / "dtype_choice.json"
    bad.write_text("{not json")
    calls: list = []
    times = {torch.float32: 1.0, torch.bfloat16: 3.0}
    assert choose_cpu_dtype(SHAPES, str(bad), fake_timer(times, calls)) == torch.float32 and calls
    bad.write_text(json.dumps({cache_key(SHAPES): {"choice": "int3", "timings": {}}}))  # not a dtype: measured again
    calls.clear()
    assert choose_cpu_dtype(SHAPES, str(bad), fake_timer(times, calls)) == torch.float32 and calls
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert choose_cpu_dtype(SHAPES, str(blocker / "x.json"), fake_timer(times, [])) == torch.float32
    assert choose_cpu_dtype(SHAPES, None, fake_timer(times, [])) == torch.float32


def test_the_key_names_the_machine_torch_threads_and_shapes():
    key = cache_key(SHAPES)
    assert torch.__version__ in key and f"{torch.get_num_threads()} threads" in key and str(list(SHAPES)) in key
    assert cache_key(((1, 2),)) != key


def test_the_real_timer_runs_both_dtypes():
    for dt in (torch.float32, torch.bfloat16):
        assert time_matmuls(dt, ((8, 8),), ms=(2, 4), reps=1) > 0.0


def test_resolve_dtype_measures_only_for_auto_on_the_cpu(monkeypatch, tmp_path):
    monkeypatch.setenv("RADIXSERVE_CACHE", str(tmp_path))
    config = SimpleNamespace(hidden_size=8, intermediate_size=16)
    assert mlp_shapes(config) == SHAPES
    calls: list = []
    monkeypatch.setattr(dtype_choice, "time_matmuls",
                        fake_timer({torch.float32: 2.0, torch.bfloat16: 1.0}, calls))
    monkeypatch.setattr("radixserve.worker.model_runner.choose_cpu_dtype",
                        lambda shapes, path: choose_cpu_dtype(shapes, path, dtype_choice.time_matmuls))
    cpu = torch.device("cpu")
    assert resolve_dtype("float32", cpu, config) == torch.float32 and resolve_dtype("bf16", cpu, config) == torch.bfloat16
    assert calls == []  # an explicit dtype is never measured
    assert resolve_dtype("auto", cpu, config) == torch.bfloat16 and len(calls) == 2
    assert (tmp_path / "dtype_choice.json").exists()
    assert resolve_dtype("auto", torch.device("cuda"), config) == torch.bfloat16
    with pytest.raises(ValueError, match="^dtype: unknown dtype"):
        resolve_dtype("int3", cpu, config)
