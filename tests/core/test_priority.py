"""Request priorities on the real scheduler (tiny model): a high-priority request that
arrives behind 64 low-priority ones is admitted first; with ``enable_priority_preemption``
it gets its first token before any of them finishes (a running one is retracted for it, by
rows or by memory), and every output still equals the run without priorities.  The
allocator's invariants hold after every step."""
from __future__ import annotations

import random

import pytest

from tests.helpers.models import make_engine

LOW = 64


def workload(seed: int = 0):
    rng = random.Random(seed)
    prompts = [[rng.randrange(100, 40000) for _ in range(rng.randrange(8, 24))] for _ in range(LOW + 1)]
    params = [{"max_new_tokens": 24, "temperature": 0, "ignore_eos": True} for _ in range(LOW)]
    params.append({"max_new_tokens": 4, "temperature": 0, "ignore_eos": True, "priority": 5})
    return prompts, params


def run(eng, prompts, params, high_after_steps: int):
    """Queue the 64 low requests, step ``high_after_steps`` times, queue the high one, run to
    the end.  Returns (requests, the step after its arrival in which the high one got its
    first token, the one in which the first low one finished, the requests of the first
    admission after it arrived, in admission order)."""
    reqs, _ = eng.make_requests(None, params, prompts, False, -1, 0)
    low, high = reqs[:LOW], reqs[LOW]

    def drive(sched):
        for r in low:
            sched.add_request(r)
        steps, first_token, first_low_done = 0, None, None
        for _ in range(high_after_steps):
            sched.step()
            assert not any(r.finished for r in low)
        sched.add_request(high)
        before = set(id(r) for r in sched.running)
        admitted = None
        while sched.has_work():
            sched.step()
            steps += 1
            sched.check_invariants()
            if admitted is None and any(id(r) not in before for r in sched.running):
                admitted = [r for r in sched.running if id(r) not in before]
            if first_token is None and high.output_ids:
                first_token = steps
            if first_low_done is None and any(r.finished for r in low):
                first_low_done = steps
            assert steps < 5000
        kv = sched.kv.stats()
        assert kv["protected_size"] == 0 and kv["free_slots"] + kv["evictable_size"] == sched.kv.capacity
        return first_token, first_low_done, admitted

    first_token, first_low_done, admitted = eng.run_on_driver(drive)
    return reqs, first_token, first_low_done, admitted


@pytest.fixture(scope="module")
def reference(tiny_dir):
    prompts, params = workload()
    eng = make_engine(tiny_dir, max_total_tokens=8192)
    outs = eng.generate(input_ids=prompts, sampling_params=params)
    eng.shutdown()
    return [o["output_ids"] for o in outs]


def test_high_priority_is_admitted_first(tiny_dir, reference):
    prompts, params = workload()
    eng = make_engine(tiny_dir, max_running_requests=8)
    reqs, first_token, first_low_done, admitted = run(eng, prompts, params, high_after_steps=0)
    assert admitted[0] is reqs[LOW], [r.rid for r in admitted]  # queued last, admitted first
    assert first_token == 1
    assert [r.output_ids for r in reqs] == reference
    eng.shutdown()


LIMITS = {"rows": {"max_running_requests": LOW}, "memory": {"max_total_tokens": 1500}}


@pytest.mark.parametrize("blocked_by", ["rows", "memory"])
def test_without_preemption_it_waits_for_a_low_one_to_finish(tiny_dir, reference, blocked_by):
    prompts, params = workload()
    eng = make_engine(tiny_dir, new_token_ratio=1.0, **LIMITS[blocked_by])
    reqs, first_token, first_low_done, _ = run(eng, prompts, params, high_after_steps=6)
    assert first_token > first_low_done
    assert [r.output_ids for r in reqs] == reference
    eng.shutdown()


@pytest.mark.parametrize("blocked_by", ["rows", "memory"])
def test_preemption_gives_the_first_token_before_any_low_finishes(tiny_dir, reference, blocked_by):
    prompts, params = workload()
    eng = make_engine(tiny_dir, enable_priority_preemption=True, new_token_ratio=1.0, **LIMITS[blocked_by])
    reqs, first_token, first_low_done, _ = run(eng, prompts, params, high_after_steps=6)
    assert first_token is not None and first_token < first_low_done
    assert first_token <= 2  # the next step admits it
    assert sum(r.retractions > 0 for r in reqs[:LOW]) >= 1  # somebody was preempted for it
    assert reqs[LOW].retractions == 0
    assert sum(r.retractions for r in reqs) == eng.run_on_driver(lambda s: s.num_retractions)
    assert [r.output_ids for r in reqs] == reference
    eng.shutdown()
