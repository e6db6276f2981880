"""200 random requests under a KV budget far too small to hold them at once."""
from __future__ import annotations

import random

from conftest import make_engine


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
