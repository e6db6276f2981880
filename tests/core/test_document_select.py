"""CacheBlend's choice of the reused document tokens to recompute (worker/doc_select.py) through the
in-process Engine, on the 2-layer tiny random Llama (layer 1's K/V depend on the context).

``choose`` is wrapped to see each window's ``compute`` before and after the probe: the count is
kept, the tokens outside the candidates stay computed, and a token whose stored KV is corrupted on
purpose is chosen (it is not chosen without the corruption, so the test can fail).  Share 1 is a
plain prefill whatever the rule; the allocator's invariants are checked after every scenario.
"""
from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from radixserve.worker import doc_select
from tests.core.test_documents import GREEDY, SYS, A, B, C, Q, assert_same, reference, segs
from tests.helpers.models import build_tiny_llama, make_engine

DEV = {**GREEDY, "document_select": "deviation"}
MOVED = segs((SYS, False), (B, True), (C, True), (A, True), (Q, False))


@pytest.fixture
def probes(monkeypatch) -> list[dict]:
    """Every ``choose`` call's windows: slots, candidates, compute before and after."""
    seen: list[dict] = []
    real = doc_select.choose

    def spy(model, backend, pool, table, reqs, device):
        before = [(r, None if r.compute is None else r.compute.copy()) for r in reqs]
        real(model, backend, pool, table, reqs, device)
        for r, c in before:
            if r.doc_select == "deviation" and c is not None:
                seen.append({"cand": np.nonzero(np.isin(r.slots, r.reuse_dst))[0], "before": c,
                             "after": r.compute.copy(), "n": len(r.slots), "start": r.start})
    monkeypatch.setattr(doc_select, "choose", spy)
    return seen


def place_twice(eng, share: float, params: dict = DEV) -> dict:
    """Cache A and B as documents, then place B, C, A at new positions; the second output."""
    p = {**params, "document_recompute": share}
    eng.generate(segments=segs((SYS, False), (A, True), (B, True), (Q, False)), sampling_params=p)
    eng.check_invariants()
    out = eng.generate(segments=MOVED, sampling_params=p, return_logprob=True)
    eng.check_invariants()
    return out


@pytest.mark.parametrize("kw", [{}, {"attention_backend": "torch_native"}, {"kv_cache_dtype": "int8"}],
                         ids=["cpu", "torch_native", "int8_kv"])
def test_the_probe_keeps_the_count_and_every_token_outside_documents(tiny_dir, probes, kw):
    eng = make_engine(tiny_dir, chunked_prefill_size=64, **kw)  # several windows, one document across two
    out = place_twice(eng, 0.15)
    eng.shutdown()
    meta = out["meta_info"]
    docs = len(A) + len(B) + len(C)
    assert meta["document_reused_tokens"] + meta["document_recomputed_tokens"] == docs
    assert meta["document_reused_tokens"] > 0
    moved = False
    for w in probes:
        before, after, cand = w["before"], w["after"], w["cand"]
        assert len(after) == len(before) and len(np.unique(after)) == len(after)  # the budget, no duplicate
        assert np.all(np.diff(after) > 0) and after.min() >= 0 and after.max() < w["n"]
        must = np.setdiff1d(before, cand)  # outside documents, the last token, uncached document tokens
        assert np.isin(must, after).all()
        assert np.isin(np.setdiff1d(after, must), cand).all()  # the rest are candidates
        moved |= not np.array_equal(before, after)
    assert probes and moved  # the probe ran and chose other tokens than the first ones


def test_share_one_with_deviation_is_a_full_prefill(tiny_dir, probes):
    want = reference(tiny_dir, [SYS + B + C + A + Q])[0]
    eng = make_engine(tiny_dir)
    got = place_twice(eng, 1.0)
    eng.shutdown()
    assert got["meta_info"]["document_reused_tokens"] == 0
    assert_same(got, want)
    assert got["output_ids"] == want["output_ids"]


def _target(windows: list[dict]) -> int:
    """A prompt position that is a candidate the probe did not choose (the middle one of those)."""
    pos = sorted({w["start"] + int(i) for w in windows for i in np.setdiff1d(w["cand"], w["after"])})
    assert pos
    return pos[len(pos) // 2]


@pytest.mark.parametrize("kw", [{}, {"kv_cache_dtype": "int8"}], ids=["fp32", "int8_kv"])
def test_a_token_whose_reused_kv_is_wrong_is_recomputed(tiny_dir, probes, monkeypatch, kw):
    eng = make_engine(tiny_dir, **kw)
    place_twice(eng, 0.15)
    target = _target(probes)
    probes.clear()
    spy = doc_select.choose
    hit: list[bool] = []

    def corrupt(model, backend, pool, table, reqs, device):
        for r in reqs:
            i = target - r.start
            if 0 <= i < len(r.slots) and r.reuse_dst is not None and r.slots[i] in r.reuse_dst:
                j = int(np.nonzero(r.reuse_dst == r.slots[i])[0][0])
                for loc in (int(r.reuse_src[j]), int(r.slots[i])):  # the stored document KV and its copy
                    at = torch.tensor([loc])
                    k, v = pool.read_kv(1, at)
                    pool.set_kv(1, at, k + 3.0 * k.abs().max(), v - 3.0 * v.abs().max())
                hit.append(True)
        spy(model, backend, pool, table, reqs, device)
    monkeypatch.setattr(doc_select, "choose", corrupt)
    eng.generate(segments=MOVED, sampling_params={**DEV, "document_recompute": 0.15})
    eng.check_invariants()
    eng.shutdown()
    assert hit
    chosen = {w["start"] + int(i) for w in probes for i in w["after"]}
    assert target in chosen


def test_a_model_the_probe_cannot_drive_falls_back_to_the_first_tokens(smol_dir, tmp_path, probes, caplog):
    one = build_tiny_llama(smol_dir, str(tmp_path / "one"), layers=1)
    reason = "a model with fewer than two layers (nothing deviates before layer 1)"
    doc_select._LOGGED.discard(reason)
    eng = make_engine(one)
    with caplog.at_level(logging.WARNING, logger="radixserve.worker.doc_select"):
        dev = place_twice(eng, 0.15)
    eng.flush_cache()
    first = place_twice(eng, 0.15, {**GREEDY, "document_select": "first"})
    eng.shutdown()
    assert probes and all(np.array_equal(w["before"], w["after"]) for w in probes)
    assert dev["output_ids"] == first["output_ids"]
    assert reason in doc_select._LOGGED and reason in caplog.text


def test_document_select_is_checked():
    from radixserve.config import SchedulerConfig
    from radixserve.sampling_params import SamplingParams

    with pytest.raises(ValueError, match="^sampling_params.document_select:"):
        SamplingParams(document_select="last").verify(1000)
    with pytest.raises(ValueError, match="^document_select:"):
        SchedulerConfig(document_select="last")
    SamplingParams(document_select="first").verify(1000)


def test_the_flag_is_checked_at_parse_time(capsys):
    from radixserve.cli import engine_config_from_args, parse_args

    assert engine_config_from_args(parse_args(["serve", "--document-select", "first"])).scheduler.document_select \
        == "first"
    with pytest.raises(SystemExit):
        parse_args(["serve", "--document-select", "last"])
    assert "document-select" in capsys.readouterr().err
