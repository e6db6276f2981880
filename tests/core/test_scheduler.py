"""Scheduling behaviour: admission, eviction and retraction under a KV budget far too small
for the load (no leaks, the same outputs), n copies sharing their prompt's prefix,
``disable_radix_cache``, and the output deltas the scheduler sends."""
from __future__ import annotations

import random

from tests.helpers.models import hf_greedy, make_engine
from tests.helpers.models import random_prompts as _prompts
from radixserve.sampling_params import SamplingParams
from radixserve.scheduler.outputs import take_output
from radixserve.scheduler.req import Req


# 200 random requests under a KV budget far too small to hold them at once.
def test_budget_retraction_no_leaks(tiny_dir):
    rng = random.Random(0)
    shared = [rng.randrange(100, 40000) for _ in range(40)]
    prompts, params = [], []
    for i in range(200):
        body = [rng.randrange(100, 40000) for _ in range(rng.randrange(1, 40))]
        prompts.append((shared + body) if i % 3 else body)
        params.append({"max_new_tokens": rng.randrange(1, 40), "temperature": 0, "ignore_eos": True})
    # one at a time, with plenty of memory: the reference
    solo = make_engine(tiny_dir, max_total_tokens=4096)
    ref = [solo.generate(input_ids=p, sampling_params=sp)["output_ids"] for p, sp in zip(prompts, params)]
    # all at once, with room for only a few requests: admission, eviction and retraction at work
    eng = make_engine(tiny_dir, max_total_tokens=400, chunked_prefill_size=64, new_token_ratio=0.05)
    reqs, _ = eng.make_requests(None, params, prompts, False, -1, 0)

    def drive(sched) -> None:  # on the engine's driver thread, which owns the scheduler
        steps = 0
        for r in reqs:
            sched.add_request(r)
        while sched.has_work():
            sched.step()
            eng.check_invariants()
            steps += 1
            assert steps < 20000, "scheduler made no progress"
        assert [r.output_ids for r in reqs] == ref
        assert all(r.finish_reason["type"] == "length" for r in reqs)
        assert sched.num_retractions > 0, "the budget never forced a retraction"
        kv = sched.kv
        s = kv.stats()
        assert s["protected_size"] == 0
        assert s["free_slots"] + s["evictable_size"] == kv.capacity

    eng.run_on_driver(drive)


def test_n_copies_share_the_prompt(tiny_engine):
    prompt = list(range(2000, 2080))
    outs = tiny_engine.generate(input_ids=prompt, sampling_params={"max_new_tokens": 8, "temperature": 30.0,
                                                                  "n": 4, "seed": 7})
    assert len(outs) == 4
    assert len({tuple(o["output_ids"]) for o in outs}) > 1
    assert sum(o["meta_info"]["cached_tokens"] >= len(prompt) - 1 for o in outs) >= 3


def test_disable_radix_cache(tiny_dir, tiny_hf):
    eng = make_engine(tiny_dir, disable_radix_cache=True)
    prompts = _prompts(3, 4)
    outs = eng.generate(input_ids=prompts + prompts, sampling_params={"max_new_tokens": 8, "temperature": 0})
    for p, o in zip(prompts + prompts, outs):
        assert o["output_ids"] == hf_greedy(tiny_hf, p, 8)
        assert o["meta_info"]["cached_tokens"] == 0
    eng.check_invariants()
    s = eng.stats()
    assert s["free_slots"] == s["num_slots"]


def test_take_output_deltas():
    req = Req("r", [1, 2, 3], SamplingParams(max_new_tokens=4))
    req.arrival = 0.0
    req.output_ids += [7, 8]
    a = take_output(req, 1.5)
    assert a.new_ids == [7, 8] and a.queue_time == 1.5 and not a.finished
    assert take_output(req, 2.0) is None
    req.output_ids.append(9)
    req.finish_reason = {"type": "length", "length": 3}
    b = take_output(req, 2.0)
    assert b.new_ids == [9] and b.finished and b.queue_time is None and b.completion_tokens == 3


def test_prompt_logprobs_survive_a_retraction_mid_prompt(tiny_dir):
    """A request retracted between two prompt chunks recomputes its prompt logprobs on
    re-admission: the list still starts with the first token's None and equals the one of a
    request that was never retracted."""
    from radixserve.scheduler.build import new_req

    ids = list(range(300, 340))  # 40 tokens: chunks of 16, 16, 8
    eng = make_engine(tiny_dir, chunked_prefill_size=16)
    try:
        eng.flush_cache()
        ref = eng.generate(input_ids=ids, sampling_params={"max_new_tokens": 2, "temperature": 0},
                           return_logprob=True, logprob_start_len=0)["meta_info"]["input_token_logprobs"]
        eng.flush_cache()

        def scenario(s):
            msg = eng.builder.build([ids], [{"max_new_tokens": 2, "temperature": 0}], ["input_ids"], None, True, 0)[0]
            req = new_req(msg)
            s.add_request(req)
            s.step()
            assert 0 < req.kv_len < len(ids), "the first step must stop mid-prompt"
            s._retract(req)
            s.check_invariants()
            while s.has_work():
                s.step()
            s.check_invariants()
            return list(req.input_logprobs)

        got = eng.run_on_driver(scenario, 60)
    finally:
        eng.shutdown()
    assert len(got) == len(ids) == len(ref)
    assert got[0] is None and ref[0][0] is None
    assert all(abs(g.logprob - r[0]) < 1e-5 for g, r in zip(got[1:], ref[1:]))


def test_forward_token_counters_count_the_work_done(tiny_engine):
    """``stats()``'s forward_tokens: every prompt token not served from the cache, plus one per
    decode step; a repeated prompt adds only its uncached tail and its decode steps."""
    tiny_engine.flush_cache()
    before = tiny_engine.stats()
    prompt = list(range(200, 260))
    sp = {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True}
    out = tiny_engine.generate(input_ids=prompt, sampling_params=sp)
    mid = tiny_engine.stats()
    # 60 prompt tokens in the prefill (which samples the first token), then 4 decode rows
    assert mid["forward_tokens"] - before["forward_tokens"] == 60 + 4
    assert mid["forward_steps"] > before["forward_steps"]
    again = tiny_engine.generate(input_ids=prompt, sampling_params=sp)
    after = tiny_engine.stats()
    assert again["output_ids"] == out["output_ids"]
    cached = again["meta_info"]["cached_tokens"]
    assert cached > 0
    assert after["forward_tokens"] - mid["forward_tokens"] == (60 - cached) + 4


def test_mixed_chunk_decodes_inside_prefill_steps_with_the_same_outputs(tiny_dir):
    # requests arriving while others decode: with enable_mixed_chunk every extend step also
    # carries the decode-ready requests' next token; greedy outputs as one at a time, no leaks
    rng = random.Random(1)
    shared = [rng.randrange(100, 40000) for _ in range(24)]
    prompts = [shared + [rng.randrange(100, 40000) for _ in range(rng.randrange(1, 30))] for _ in range(24)]
    params = [{"max_new_tokens": rng.randrange(2, 24), "temperature": 0, "ignore_eos": True} for _ in prompts]
    solo = make_engine(tiny_dir, max_total_tokens=4096)
    ref = [solo.generate(input_ids=p, sampling_params=sp)["output_ids"] for p, sp in zip(prompts, params)]
    eng = make_engine(tiny_dir, max_total_tokens=600, chunked_prefill_size=16, enable_mixed_chunk=True)
    reqs, _ = eng.make_requests(None, params, prompts, False, -1, 0)

    def drive(sched) -> None:
        mixed = 0
        step = sched.worker.step

        def watch(plan):
            nonlocal mixed
            prompt = any(r.num_output == 0 for r in plan.reqs)  # a prompt's chunk
            decode = any(r.num_output > 0 and len(r.input_ids) == 1 and r.sample for r in plan.reqs)
            mixed += int(not plan.decode and prompt and decode)
            return step(plan)

        sched.worker.step = watch
        pending, steps = list(reqs), 0
        while pending or sched.has_work():
            if pending and steps % 3 == 0:  # a new request every third step
                sched.add_request(pending.pop(0))
            sched.step()
            eng.check_invariants()
            steps += 1
            assert steps < 5000, "scheduler made no progress"
        sched.worker.step = step
        assert [r.output_ids for r in reqs] == ref
        assert mixed > 0, "no extend step carried a decode row"
        s = sched.kv.stats()
        assert s["protected_size"] == 0 and s["free_slots"] + s["evictable_size"] == sched.kv.capacity

    eng.run_on_driver(drive)
