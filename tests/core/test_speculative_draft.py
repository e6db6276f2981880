"""Speculative decoding with a draft model (``--speculative-algorithm draft``) on tiny random
Llamas: greedy outputs equal HF fp32 and speculation off whether the draft mostly agrees
(a sharpened draft that, like the target, tends to repeat) or mostly disagrees (an
unsharpened one); the target as its own draft accepts every proposal at temperature 0;
sampled outputs keep the target's distribution (rejection sampling against the draft's q);
a small pool with retraction keeps the allocator's invariants."""
from __future__ import annotations

import random

import pytest

from tests.helpers.chi2 import same_distribution
from tests.helpers.spec_helpers import greedy_three_ways
from tests.helpers.spec_helpers import spec_counts as _counts
from tests.helpers.models import build_tiny_llama, make_engine
from tests.helpers.models import random_prompts as _prompts


def _tiny_llama(path: str, tok_dir: str, seed: int, tie: bool) -> str:
    """Tied embeddings sharpened as in conftest: the draft tends to repeat the last token, as
    the tiny target does; untied, its LM head is random and disagrees with the target."""
    return build_tiny_llama(tok_dir, path, hidden=32, layers=1, heads=2, kv_heads=1, seed=seed, tie=tie)


@pytest.fixture(scope="module")
def drafts(tmp_path_factory, tiny_dir) -> dict[str, str]:
    root = tmp_path_factory.mktemp("drafts")
    return {"agreeing": _tiny_llama(str(root / "agree"), tiny_dir, 1, True),
            "disagreeing": _tiny_llama(str(root / "disagree"), tiny_dir, 2, False)}


@pytest.fixture(scope="module")
def plain(tiny_dir):
    return make_engine(tiny_dir)


def _draft_engine(tiny_dir, draft: str, **kw):
    return make_engine(tiny_dir, speculative_algorithm="draft", speculative_draft_model=draft,
                       speculative_num_tokens=3, **kw)


@pytest.mark.parametrize("which", ["agreeing", "disagreeing", "self"])
def test_greedy_equals_off_and_hf(tiny_dir, tiny_hf, plain, drafts, which):
    eng = _draft_engine(tiny_dir, tiny_dir if which == "self" else drafts[which], chunked_prefill_size=16)
    got, off, hf, outs = greedy_three_ways(eng, plain, tiny_hf, _prompts(11, 6), 20)
    assert got == off == hf
    proposed, accepted = _counts(outs)
    assert proposed > 0
    if which == "self":
        assert accepted == proposed  # the target's own greedy proposals are all accepted
    elif which == "agreeing":
        assert accepted > proposed // 2, (proposed, accepted)
    else:
        assert accepted < proposed, (proposed, accepted)
    eng.check_invariants()


def test_sampled_distribution_equals_speculation_off(tiny_dir, plain, drafts):
    eng = _draft_engine(tiny_dir, drafts["agreeing"])
    prompt = [300, 301, 302, 303] * 4
    sp = {"max_new_tokens": 4, "temperature": 4.0, "n": 300, "ignore_eos": True}
    on = eng.generate(input_ids=prompt, sampling_params={**sp, "seed": 7})
    off = plain.generate(input_ids=prompt, sampling_params={**sp, "seed": 200000})
    proposed, accepted = _counts(on)
    assert 0 < accepted < proposed, (proposed, accepted)
    for pos in (1, 2, 3):
        def cat(o, pos=pos):
            t, prev = o["output_ids"][pos], o["output_ids"][pos - 1]
            return "repeat" if t == prev else ("cycle" if t in (300, 301, 302, 303) else "other")
        a, b = [cat(o) for o in on], [cat(o) for o in off]
        assert same_distribution(a, b) > 1e-3, (pos, a.count("repeat"), b.count("repeat"))
    eng.check_invariants()


def test_small_pool_with_retraction(tiny_dir, plain, drafts):
    rng = random.Random(3)
    prompts = _prompts(12, 24)
    params = [{"max_new_tokens": rng.randrange(2, 24), "temperature": 0, "ignore_eos": True} for _ in prompts]
    ref = [o["output_ids"] for o in plain.generate(input_ids=prompts, sampling_params=params)]
    eng = _draft_engine(tiny_dir, drafts["agreeing"], max_total_tokens=500, chunked_prefill_size=32,
                        new_token_ratio=0.05)
    reqs, _ = eng.make_requests(None, params, prompts, False, -1, 0)

    def drive(sched) -> None:
        for r in reqs:
            sched.add_request(r)
        while sched.has_work():
            sched.step()
            sched.check_invariants()
        assert [r.output_ids for r in reqs] == ref
        assert sched.num_retractions > 0 and sum(r.spec_accepted for r in reqs) > 0
        s = sched.kv.stats()
        assert s["free_slots"] + s["evictable_size"] == sched.kv.capacity

    eng.run_on_driver(drive)


def test_auto_off_pauses_a_draft_that_never_agrees(tiny_dir, drafts):
    """Without the gate every one of the 59 decode steps would verify 3 proposed tokens; it
    pauses after 4 rejected proposals (16 steps, then 32), so only a few are verified."""
    eng = _draft_engine(tiny_dir, drafts["disagreeing"])
    outs = eng.generate(input_ids=_prompts(11, 4), sampling_params={"max_new_tokens": 60, "temperature": 0,
                                                                     "ignore_eos": True})
    for o in outs:
        meta = o["meta_info"]
        assert meta["completion_tokens"] == 60
        assert 0 < meta["spec_proposed_tokens"] <= 3 * 10 and meta["spec_accepted_tokens"] <= 3, meta
    eng.check_invariants()
