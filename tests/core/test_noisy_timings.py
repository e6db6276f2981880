"""A plainly noisy timing is retaken, and never cached as it is (radixserve/worker/tuning/noise.py,
used by kernel_timing.measured_timings and attention_timing.dense_rule).  Timers and the load
probe are fakes: these tests check the rule, never this machine's speed or which path it picks."""
from __future__ import annotations

import json
import logging

import pytest
import torch

from radixserve.mem_cache.kv_pool import KVPool
from radixserve.worker.tuning import attention_timing as at
from radixserve.worker.tuning import noise
from radixserve.worker.tuning.kernel_timing import DENSE, cache_key, measured_timings, stored_paths

SHAPES = ((8, 16), (16, 8))
MS = (1, 2, 8, 64)
CLEAN = {"float32": {1: 1e-4, 2: 3e-4, 8: 4e-4, 64: 9e-4}, "bfloat16": {1: 2e-4, 2: 2e-4, 8: 3e-4, 64: 5e-4}}


@pytest.fixture(autouse=True)
def quiet_machine():
    """Each test starts with no memory of a busy machine, and leaves none."""
    noise.reset()
    yield
    noise.reset()


def timer_with(outliers: dict[str, list[dict[int, float]]], calls: list):
    """CLEAN's times, with ``outliers[path][i]`` laid over the i-th take of ``path``."""
    def timer(path, shapes, ms):
        take = sum(1 for c in calls if c == path)
        calls.append(path)
        over = outliers.get(path, [])
        return {m: (over[take] if take < len(over) else {}).get(m, CLEAN[path][m]) for m in ms}
    return timer


def cached(path) -> dict:
    data = json.load(open(path))
    return data[cache_key(SHAPES, MS)]["timings"] if data else {}


def test_the_monotone_rule():
    assert noise.outliers({1: 1.0, 2: 3.0, 8: 4.0}) == []
    assert noise.outliers({1: 1.0, 4: 1.4, 8: 1.0}) == []  # within the slack: real kernels do this
    assert noise.outliers({1: 1.368e-3, 2: 14.547e-3, 8: 1.5e-3, 64: 4e-3}) == ["2: 14547 us, 9.7x 8"]
    assert noise.merge_min({1: 1.0, 2: 9.0}, {1: 2.0, 2: 3.0}) == {1: 1.0, 2: 3.0}


def test_an_outlier_is_retaken_and_the_cache_holds_the_clean_value(tmp_path, caplog):
    path = str(tmp_path / "kernel_timings.json")
    calls: list = []
    # fp32 at 2 rows takes 60 ms once (a busy moment): slower than at 8 and 64 rows
    timer = timer_with({"float32": [{2: 60e-3}]}, calls)
    with caplog.at_level(logging.INFO):
        got, from_cache = measured_timings(SHAPES, DENSE, path, timer, MS)
    assert calls == ["float32", "float32", "bfloat16"] and not from_cache
    assert got == CLEAN
    assert cached(path)["float32"] == {str(m): t for m, t in CLEAN["float32"].items()}
    assert "kernel timing of float32: noisy (2: 60000 us, 150.0x 8); retaking it" in caplog.text
    assert "still noisy" not in caplog.text
    calls.clear()
    assert measured_timings(SHAPES, DENSE, path, timer, MS) == (CLEAN, True) and calls == []


@pytest.mark.parametrize("quiet_later", [True, False])
def test_a_timing_that_stays_noisy_is_provisional(tmp_path, monkeypatch, caplog, quiet_later):
    """Never cached as a clean table: kept as provisional, which a later start retakes when the
    machine is quiet and uses as it is while the machine is busy (no timing at every start)."""
    path = str(tmp_path / "kernel_timings.json")
    calls: list = []
    always = [{2: 60e-3}] * noise.MAX_TAKES
    with caplog.at_level(logging.WARNING):
        got, _ = measured_timings(SHAPES, DENSE, path, timer_with({"bfloat16": always}, calls), MS)
    assert calls.count("bfloat16") == noise.MAX_TAKES and calls.count("float32") == 1
    assert got["bfloat16"][2] == 60e-3  # this start uses what it measured...
    assert cached(path)["bfloat16"]["noisy"].startswith("2: 60000 us")  # ...kept only as provisional
    assert "noisy" not in cached(path)["float32"]
    assert "bfloat16" not in stored_paths(SHAPES, path, MS) and "float32" in stored_paths(SHAPES, path, MS)
    assert "kernel timing of bfloat16 still noisy after 3 takes (2: 60000 us" in caplog.text
    calls.clear()
    monkeypatch.setattr(noise, "quiet_now", lambda threads: quiet_later)
    got, from_cache = measured_timings(SHAPES, DENSE, path, timer_with({}, calls), MS)
    if quiet_later:  # a quiet machine: the provisional table is retaken (and only it), then clean
        assert calls == ["bfloat16"] and got == CLEAN and not from_cache and "noisy" not in cached(path)["bfloat16"]
    else:  # still busy: used as it is, nothing timed
        assert calls == [] and from_cache and got["bfloat16"][2] == 60e-3


def test_a_noisy_table_cached_before_the_rule_is_measured_again(tmp_path):
    path = tmp_path / "kernel_timings.json"
    old = {p: {str(m): t for m, t in v.items()} for p, v in CLEAN.items()}
    old["float32"]["2"] = 14.5e-3  # a 10x outlier that an older version cached for good
    path.write_text(json.dumps({cache_key(SHAPES, MS): {"timings": old}}))
    calls: list = []
    got, _ = measured_timings(SHAPES, DENSE, str(path), timer_with({}, calls), MS)
    assert calls == ["float32"] and got == CLEAN and cached(str(path))["float32"]["2"] == CLEAN["float32"][2]


def test_a_table_timed_while_other_processes_ran_is_retaken_then_refused(tmp_path, monkeypatch, caplog):
    """The load probe: other processes' CPU time during a take (here a fake /proc/stat that
    gains two busy cores' worth of ticks per read) makes it noisy, however clean its numbers."""
    ticks = iter(range(0, 10 ** 9, 10 ** 6))
    monkeypatch.setattr(noise, "_cpu_ticks", lambda: next(ticks))
    monkeypatch.setattr(noise, "MIN_WINDOW_S", 0.0)
    path = str(tmp_path / "kernel_timings.json")
    calls: list = []
    with caplog.at_level(logging.INFO):
        got, _ = measured_timings(SHAPES, DENSE, path, timer_with({}, calls), MS)
    assert got == CLEAN and stored_paths(SHAPES, path, MS) == set()  # provisional only, never clean
    assert all("other processes used" in e["noisy"] for e in cached(path).values())
    # one retake, busy again: the load lasts, so no more retakes on this start
    assert calls == ["float32", "float32", "bfloat16"]
    assert "other processes used" in caplog.text and "the machine stays busy" in caplog.text
    assert "kernel timing of bfloat16 still noisy after 1 take (" in caplog.text


def test_once_the_machine_stays_busy_the_other_paths_are_timed_quickly(tmp_path, monkeypatch):
    ticks = iter(range(0, 10 ** 9, 10 ** 6))
    monkeypatch.setattr(noise, "_cpu_ticks", lambda: next(ticks))
    monkeypatch.setattr(noise, "MIN_WINDOW_S", 0.0)
    seen = []

    def timer(path, shapes, ms, quick=False):
        seen.append((path, quick))
        return dict(CLEAN[path])

    measured_timings(SHAPES, DENSE, str(tmp_path / "t.json"), timer, MS)
    assert seen == [("float32", False), ("float32", False), ("bfloat16", True)]


def test_retakes_stop_when_their_budget_is_spent(tmp_path, monkeypatch):
    monkeypatch.setattr("radixserve.worker.tuning.kernel_timing.RETAKE_BUDGET_S", 0.0)
    calls: list = []
    always = [{2: 60e-3}] * noise.MAX_TAKES
    measured_timings(SHAPES, DENSE, str(tmp_path / "t.json"), timer_with({"float32": always, "bfloat16": always},
                                                                         calls), MS)
    assert calls == ["float32", "bfloat16"]  # no budget: no retake (the outliers are used once, not cached)


def attn(causal_512: float = 1e-3) -> dict[str, list[float]]:
    return {"causal_kernel": [causal_512, 4e-3], "causal_flash": [2e-3, 3e-3],
            "shared_kernel": [1e-3, 2e-3], "shared_flash": [2e-3, 3e-3]}


@pytest.mark.parametrize("noisy_takes,cached_after", [(1, True), (noise.MAX_TAKES, False)])
def test_attention_timing_is_retaken_and_cached_only_when_clean(tmp_path, monkeypatch, noisy_takes, cached_after):
    monkeypatch.setenv("RADIXSERVE_CACHE", str(tmp_path))
    monkeypatch.setattr(at.cpu_native, "build_key", lambda: "fake")
    calls = []

    def measure(dtype, hkv, d, g):
        calls.append(1)
        return attn(60e-3 if len(calls) <= noisy_takes else 1e-3)  # 512 tokens slower than 1536: noise

    pool = KVPool(16, 1, 2, 64, torch.float32)
    rule = at.dense_rule(pool, 2, measure)
    assert len(calls) == min(noisy_takes + 1, noise.MAX_TAKES)
    saved = json.load(open(tmp_path / "attention_timings.json"))
    assert len(saved) == 1 and next(iter(saved)).endswith(" | provisional") != cached_after
    if cached_after:
        assert next(iter(saved.values()))["causal_kernel"] == [1e-3, 4e-3]  # the clean take
        assert at.dense_rule(pool, 2, measure) == rule and len(calls) == noisy_takes + 1  # from the cache
    else:
        assert rule == at.rule_from(attn(60e-3), 2)  # this start uses what it measured, kept as provisional
        monkeypatch.setattr(noise, "quiet_now", lambda threads: False)
        assert at.dense_rule(pool, 2, measure) == rule and len(calls) == noise.MAX_TAKES  # busy: used, not retaken
        monkeypatch.setattr(noise, "quiet_now", lambda threads: True)
        at.dense_rule(pool, 2, measure)  # quiet: retaken (clean now), then cached as a clean table
        saved = json.load(open(tmp_path / "attention_timings.json"))
        assert len(calls) == noise.MAX_TAKES + 1 and not any(k.endswith(" | provisional") for k in saved)
