"""Speculative decoding through the engine on the tiny random Llama: greedy outputs equal
speculation off and HF fp32 (with proposals accepted and rejected), the sampled output
distribution equals speculation off (chi-square), random batches with aborts and
retraction keep the allocator's invariants after every step, and stop strings, stop
tokens, max_new_tokens and logprobs behave as without speculation."""
from __future__ import annotations

import random
import re

import pytest
import torch

from tests.helpers.chi2 import same_distribution
from tests.helpers.constrained_cases import TINY_CASES
from tests.helpers.spec_helpers import greedy_three_ways
from tests.helpers.spec_helpers import spec_counts as _spec_counts
from tests.helpers.models import make_engine
from tests.helpers.models import random_prompts as _prompts

SPEC = {"speculative_algorithm": "ngram", "speculative_num_tokens": 4}


def _repetitive(seed: int, n: int) -> list[list[int]]:
    """Prompts whose text repeats (accepted proposals), with traps: "x x a b c" makes the
    n-gram index propose "a b c" where the tiny model continues "x" (rejections)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        span = [rng.randrange(200, 40000) for _ in range(rng.randrange(3, 12))]
        x = span[-1]
        trap = [x, x, rng.randrange(200, 40000), rng.randrange(200, 40000), x, x, x, 77]
        out.append(span * rng.randrange(2, 4) + (trap if i % 2 else []) + span)
    return out


@pytest.fixture(scope="module")
def plain(tiny_dir):
    return make_engine(tiny_dir)


@pytest.fixture(scope="module")
def spec(tiny_dir):
    return make_engine(tiny_dir, **SPEC)


@pytest.mark.parametrize("chunk", [None, 16])
def test_greedy_equals_off_and_hf(tiny_dir, tiny_hf, plain, chunk):
    eng = make_engine(tiny_dir, chunked_prefill_size=chunk, **SPEC)
    got, off, hf, outs = greedy_three_ways(eng, plain, tiny_hf, _prompts(1, 6) + _repetitive(2, 6), 24)
    assert got == off == hf
    proposed, accepted = _spec_counts(outs)
    assert 0 < accepted < proposed, (proposed, accepted)  # both verdicts happened
    assert all(o["meta_info"]["spec_proposed_tokens"] >= o["meta_info"]["spec_accepted_tokens"] for o in outs)
    eng.check_invariants()
    assert eng.stats()["running"] == 0 and eng.stats()["protected_size"] == 0


def test_batch_mixes_speculating_and_plain_requests(spec, plain):
    """Penalties (never speculated) and repetitive requests in one batch."""
    prompts = _repetitive(3, 4)
    params = [{"max_new_tokens": 16, "temperature": 0, "frequency_penalty": 0.5 if i % 2 else 0.0}
              for i in range(4)]
    outs = spec.generate(input_ids=prompts, sampling_params=params)
    ref = plain.generate(input_ids=prompts, sampling_params=params)
    assert [o["output_ids"] for o in outs] == [r["output_ids"] for r in ref]
    assert [o["meta_info"]["spec_proposed_tokens"] > 0 for o in outs] == [True, False, True, False]
    assert _spec_counts(ref) == (0, 0) and "spec_acceptance_rate" not in ref[0]["meta_info"]
    spec.check_invariants()


def test_sampled_distribution_equals_speculation_off(spec, plain):
    """At temperature 4 the tiny model repeats its last token with p ~ 0.44 and the n-gram
    index proposes the prompt's cycle instead: proposals are accepted, rejected and
    corrected from the residual.  The emitted tokens must be distributed as without
    speculation (a rule that accepted every proposal would flood position 2 with 300)."""
    prompt = [300, 301, 302, 303] * 4
    sp = {"max_new_tokens": 4, "temperature": 4.0, "n": 300, "ignore_eos": True}
    on = spec.generate(input_ids=prompt, sampling_params={**sp, "seed": 1})
    off = plain.generate(input_ids=prompt, sampling_params={**sp, "seed": 100000})
    assert _spec_counts(on)[0] > 0
    for pos in (1, 2, 3):
        def cat(o, pos=pos):
            t = o["output_ids"][pos]
            return t if t in (300, 301, 302, 303) else -1
        a, b = [cat(o) for o in on], [cat(o) for o in off]
        assert same_distribution(a, b) > 1e-3, (pos, sorted(set(a)), a.count(300), b.count(300))
    pattern = lambda o: tuple(t == o["output_ids"][0] for t in o["output_ids"][1:])  # noqa: E731
    assert same_distribution([pattern(o) for o in on], [pattern(o) for o in off]) > 1e-3
    spec.check_invariants()


def test_stops_max_new_tokens_and_logprobs(spec, plain, tok):
    prompts = _repetitive(4, 4)
    for n in (1, 2, 3, 5, 9):
        outs = spec.generate(input_ids=prompts, sampling_params={"max_new_tokens": n, "temperature": 0,
                                                                 "ignore_eos": True})
        assert [len(o["output_ids"]) for o in outs] == [n] * 4
    # a stop token and a stop string met in the middle of an accepted proposal
    base = plain.generate(input_ids=prompts, sampling_params={"max_new_tokens": 20, "temperature": 0})
    for p, b in zip(prompts, base):
        ids = b["output_ids"]
        stop_tok = ids[7]
        s = spec.generate(input_ids=p, sampling_params={"max_new_tokens": 20, "temperature": 0,
                                                        "stop_token_ids": [stop_tok]})
        assert s["output_ids"] == ids[: ids.index(stop_tok) + 1]
        text = tok.decode(ids[6:8])
        got = spec.generate(input_ids=p, sampling_params={"max_new_tokens": 20, "temperature": 0, "stop": [text]})
        want = plain.generate(input_ids=p, sampling_params={"max_new_tokens": 20, "temperature": 0, "stop": [text]})
        assert (got["text"], got["output_ids"], got["meta_info"]["finish_reason"]) == \
            (want["text"], want["output_ids"], want["meta_info"]["finish_reason"])
    # logprobs of accepted tokens are those of a plain decode
    sp = {"max_new_tokens": 12, "temperature": 0}
    got = spec.generate(input_ids=prompts, sampling_params=sp, return_logprob=True, top_logprobs_num=2)
    want = plain.generate(input_ids=prompts, sampling_params=sp, return_logprob=True, top_logprobs_num=2)
    assert _spec_counts(got)[1] > 0
    for g, w in zip(got, want):
        gl, wl = g["meta_info"]["output_token_logprobs"], w["meta_info"]["output_token_logprobs"]
        assert [t[1] for t in gl] == g["output_ids"] == w["output_ids"]
        assert torch.allclose(torch.tensor([t[0] for t in gl]), torch.tensor([t[0] for t in wl]), atol=1e-4)
        gt, wt = g["meta_info"]["output_top_logprobs"], w["meta_info"]["output_top_logprobs"]
        assert [[t[1] for t in row] for row in gt] == [[t[1] for t in row] for row in wt]
    spec.check_invariants()


def test_random_batches_with_aborts_and_retraction_keep_invariants(tiny_dir, plain):
    rng = random.Random(5)
    prompts = _repetitive(6, 30) + _prompts(7, 30)
    rng.shuffle(prompts)
    params = [{"max_new_tokens": rng.randrange(1, 30), "temperature": 0 if i % 3 else 0.8, "seed": i,
               "ignore_eos": True} for i in range(len(prompts))]
    ref = [plain.generate(input_ids=p, sampling_params=sp)["output_ids"] if sp["temperature"] == 0 else None
           for p, sp in zip(prompts, params)]
    eng = make_engine(tiny_dir, max_total_tokens=600, chunked_prefill_size=32, new_token_ratio=0.05, **SPEC)
    reqs, _ = eng.make_requests(None, params, prompts, False, -1, 0)

    def drive(sched) -> None:
        aborted: set[str] = set()
        pending = list(reqs)
        steps = 0
        while pending or sched.has_work():
            for _ in range(rng.randrange(0, 4)):
                if pending:
                    sched.add_request(pending.pop(0))
            sched.step()
            sched.check_invariants()
            if rng.random() < 0.05 and sched.running:
                victim = rng.choice(sched.running)
                sched.abort(victim.rid)
                aborted.add(victim.rid)
                sched.check_invariants()
            steps += 1
            assert steps < 20000, "no progress"
        assert sched.num_retractions > 0, "the small pool never forced a retraction"
        assert sum(r.spec_accepted for r in reqs) > 0
        for r, want in zip(reqs, ref):
            if r.rid in aborted:
                assert r.finish_reason["type"] == "abort"
            elif want is not None:
                assert r.output_ids == want
            else:
                assert len(r.output_ids) == r.sampling.max_new_tokens
        s = sched.kv.stats()
        assert s["protected_size"] == 0
        assert s["free_slots"] + s["evictable_size"] == sched.kv.capacity  # no slot leaked

    eng.run_on_driver(drive)


@pytest.mark.parametrize("jump", [True, False])
def test_constrained_requests_speculate_within_the_grammar(tiny_dir, jump):
    """Proposals are cut where the grammar rejects them and verified under the grammar's
    masks: greedy constrained outputs equal speculation off, and still match their pattern."""
    cases = [("regex", r"((ab|cd|ef) ){6}done"), ("regex", r"(x[0-9] ){5}"),
             ("regex", r"(ab|cd)( (ab|cd)){7}")] + TINY_CASES[:4]
    prompts = ["ab cd ab cd ef ab cd ab cd ef ab", "x1 x2 x1 x2 x1 x2 x1", "ab cd ab cd ab cd ab"]
    prompts += ["the date list a"] * 4
    params = [{kind: spec, "max_new_tokens": 40, "temperature": 0} for kind, spec in cases]
    params.append({"max_new_tokens": 16, "temperature": 0})  # an unconstrained neighbour
    prompts.append("ab cd ab cd ab cd ab cd")
    outs = {}
    for name, extra in (("off", {}), ("on", SPEC)):
        eng = make_engine(tiny_dir, enable_jump_forward=jump, **extra)
        outs[name] = eng.generate(prompts, params)
        eng.check_invariants()
    assert [o["output_ids"] for o in outs["on"]] == [o["output_ids"] for o in outs["off"]]
    for (_, rx), o in zip(cases[:3], outs["on"]):
        assert re.fullmatch(rx, o["text"]), (rx, o["text"])
    if not jump:  # with jump-forward the grammar may force nearly every token: nothing left to propose
        assert _spec_counts(outs["on"][:3])[1] > 0, [o["meta_info"] for o in outs["on"][:3]]


def test_server_reports_speculation_in_meta_info_and_metrics(tiny_dir):
    """Through the serving processes (scheduler and worker over ZeroMQ): meta_info counts
    and the Prometheus counters and acceptance-rate gauge."""
    from tests.helpers.server_harness import ServerHandle

    srv = ServerHandle(tiny_dir, "--max-total-tokens", "2048", "--speculative-algorithm", "ngram",
                       "--speculative-num-tokens", "3").wait_ready()
    try:
        with srv.client() as c:
            out = c.post("/generate", json={"input_ids": _repetitive(8, 1)[0],
                                            "sampling_params": {"max_new_tokens": 24, "temperature": 0}}).json()
            meta = out["meta_info"]
            assert 0 < meta["spec_accepted_tokens"] <= meta["spec_proposed_tokens"], meta
            assert meta["spec_acceptance_rate"] == meta["spec_accepted_tokens"] / meta["spec_proposed_tokens"]
            metrics = {line.split()[0]: float(line.split()[1]) for line in c.get("/metrics").text.splitlines()
                       if line.startswith("radixserve:spec_")}
        assert metrics["radixserve:spec_proposed_tokens_total"] == meta["spec_proposed_tokens"]
        assert metrics["radixserve:spec_accepted_tokens_total"] == meta["spec_accepted_tokens"]
        assert metrics["radixserve:spec_acceptance_rate"] == pytest.approx(meta["spec_acceptance_rate"])
        info = srv.wait_idle()["scheduler"]
        assert info["invariants_ok"] and info["held_slots"] == 0
    finally:
        srv.stop()
