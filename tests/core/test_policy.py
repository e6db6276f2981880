"""Waiting-queue ordering (``scheduler/policy.py``) and priority preemption choices
(``scheduler/preemption.py``), on fake requests, a fake prefix cache and a fake clock:
deterministic, no model."""
from __future__ import annotations

from dataclasses import replace

import pytest

from radixserve.config import SchedulerConfig
from radixserve.sampling_params import SamplingParams
from radixserve.scheduler.policy import order_waiting
from radixserve.scheduler.preemption import preemption_victims
from radixserve.scheduler.req import Req


class FakeCache:
    """match_len from a table of cached prefix lengths by rid; available() slots."""

    def __init__(self, hits: dict[str, int], available: int = 10_000) -> None:
        self.hits, self.free = hits, available

    def match_len(self, req: Req) -> int:
        return self.hits.get(req.rid, 0)

    def available(self) -> int:
        return self.free


def req(rid: str, arrival: float = 0.0, priority: int = 0, prompt: int = 10, new: int = 8, out: int = 0) -> Req:
    r = Req(rid, list(range(prompt)), SamplingParams(max_new_tokens=new, priority=priority))
    r.arrival = arrival
    r.output_ids = [1] * out
    return r


def rids(reqs: list[Req]) -> list[str]:
    return [r.rid for r in reqs]


def plain_lpm(waiting: list[Req], cache: FakeCache) -> list[Req]:
    """The order before this change: longest cached prefix first, FCFS among equals."""
    return [r for _, _, r in sorted((-cache.match_len(r), i, r) for i, r in enumerate(waiting))]


def test_lpm_longest_prefix_first_fcfs_among_equals():
    cache = FakeCache({"b": 50, "c": 90, "d": 50})
    w = [req("a", 0.0), req("b", 0.1), req("c", 0.2), req("d", 0.3)]
    assert rids(order_waiting(w, cache, "lpm", 128, 0.0, 5.0)) == ["c", "b", "d", "a"]
    assert rids(order_waiting(w, cache, "fcfs", 128, 1.0, 5.0)) == ["a", "b", "c", "d"]


def test_overdue_requests_go_first_oldest_first():
    cache = FakeCache({"hit1": 90, "hit2": 80, "old_hit": 10})
    w = [req("hit1", 1.5), req("miss_late", 1.2), req("old_hit", 0.4), req("miss_old", 0.2), req("hit2", 1.9)]
    # at t=2.0 with a 1 s bound: miss_old (waited 1.8) and old_hit (1.6) are overdue
    assert rids(order_waiting(w, cache, "lpm", 128, 1.0, 2.0)) == ["miss_old", "old_hit", "hit1", "hit2", "miss_late"]
    # exactly at the bound counts as overdue
    assert rids(order_waiting(w, cache, "lpm", 128, 1.6, 2.0))[:2] == ["miss_old", "old_hit"]
    # no bound, or no clock: plain LPM
    for bound, now in ((0.0, 2.0), (-1.0, 2.0), (1.0, None)):
        assert order_waiting(w, cache, "lpm", 128, bound, now) == plain_lpm(w, cache)


def test_nothing_overdue_is_plain_lpm():
    cache = FakeCache({f"r{i}": (i * 37) % 11 for i in range(30)})
    w = [req(f"r{i}", 10.0 + i * 0.01) for i in range(30)]
    assert order_waiting(w, cache, "lpm", 128, 5.0, 11.0) == plain_lpm(w, cache)


def admission_rounds(bound: float, rounds: int) -> int:
    """A miss waits behind a stream of hits: each 0.1 s a hit arrives and one request is
    admitted (the first in order).  The round the miss is admitted in, or -1."""
    cache = FakeCache({})
    waiting = [req("miss", 0.0)] + [req(f"hit{i}", 0.0) for i in range(3)]
    for i in range(3):
        cache.hits[f"hit{i}"] = 100
    for k in range(rounds):
        now = 0.1 * (k + 1)
        waiting.append(req(f"new{k}", now))
        cache.hits[f"new{k}"] = 100
        first = order_waiting(waiting, cache, "lpm", 128, bound, now)[0]
        if first.rid == "miss":
            return k
        waiting.remove(first)
    return -1


def test_bound_stops_starvation():
    assert admission_rounds(0.0, 200) == -1  # plain LPM: the miss is passed over forever
    # with a 1 s bound it goes first in the first round at t >= 1.0 (k = 9: t = 1.0)
    assert admission_rounds(1.0, 200) == 9
    assert admission_rounds(0.5, 200) == 4


def test_priority_first_then_policy_order():
    cache = FakeCache({"hit": 90})
    w = [req("lo_old", 0.0, priority=-1), req("hit", 1.9), req("miss", 1.8), req("hi", 1.95, priority=3),
         req("hi2", 1.96, priority=3)]
    # higher priority first even before an overdue request of lower priority; equals keep their order
    assert rids(order_waiting(w, cache, "lpm", 128, 1.0, 2.0)) == ["hi", "hi2", "hit", "miss", "lo_old"]
    assert rids(order_waiting(w, cache, "fcfs", 128, 1.0, 2.0)) == ["hi", "hi2", "hit", "miss", "lo_old"]
    # past lpm_queue_limit: FCFS, still by priority
    assert rids(order_waiting(w, cache, "lpm", 2, 1.0, 2.0)) == ["hi", "hi2", "hit", "miss", "lo_old"]


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="schedule_policy"):
        order_waiting([req("a")], FakeCache({}), "random", 128)


# ---------------------------------------------------------------- preemption choices
CFG = SchedulerConfig(max_running_requests=4, enable_priority_preemption=True)


def test_preempts_lowest_priority_least_progress_when_rows_are_full():
    running = [req("p1_far", priority=1, out=5), req("p0_far", out=6), req("p0_near", out=2), req("p2", priority=2)]
    head = req("hi", priority=2)
    got = preemption_victims([req("lo"), head], running, FakeCache({}), CFG, 0.5, 2048, 0.0)
    assert [(v.rid, h.rid) for v, h in got] == [("p0_near", "hi")]


def test_no_preemption_when_admissible_or_not_outranking():
    running = [req("a", out=1), req("b", out=1)]
    assert preemption_victims([req("hi", priority=1)], running, FakeCache({}), CFG, 0.5, 2048, 0.0) == []
    full = running + [req("c"), req("d")]
    assert preemption_victims([req("eq")], full, FakeCache({}), CFG, 0.5, 2048, 0.0) == []


def test_memory_blocked_preempts_until_it_fits():
    # each running request holds 20 computed slots and reserves 0.5 x 8 = 4 more
    running = [req(f"r{i}", out=2, new=10) for i in range(3)]
    for r in running:
        r.kv_len = 20
    head = req("hi", priority=1, prompt=40, new=8)  # needs 40 + 4
    cfg = replace(CFG, max_running_requests=64)
    # blocked: 44 + the others' reserve of 12 > available; each victim frees (at most) its
    # 20 slots and its reserve of 4, and with nothing left running only the 40 must fit
    for available, victims in ((56, 0), (40, 1), (10, 2), (0, 3)):
        got = preemption_victims([head], running, FakeCache({}, available=available), cfg, 0.5, 2048, 0.0)
        assert [v.rid for v, _ in got] == ["r0", "r1", "r2"][:victims], available
    # even retracting all three could not fit a 200-token prompt: retract nothing
    big = req("big", priority=1, prompt=200)
    assert preemption_victims([big], running, FakeCache({}, available=10), cfg, 0.5, 2048, 0.0) == []


# ---------------------------------------------------------------- on the real scheduler
def test_scheduler_admits_an_overdue_miss_next(tiny_dir):
    """One request runs at a time; a miss queued with five hits at t=0 is admitted last at
    t=0.5 (plain LPM order) but next once the fake clock passes the 1 s bound."""
    from tests.helpers.models import make_engine

    eng = make_engine(tiny_dir, max_running_requests=1, max_queue_wait_s=1.0)
    prefix = list(range(5000, 5040))
    eng.generate(input_ids=prefix + [7], sampling_params={"max_new_tokens": 0})  # cache the prefix
    prompts = [list(range(6000, 6045))] + [prefix + [100 + i] * 5 for i in range(5)]
    reqs, _ = eng.make_requests(None, {"max_new_tokens": 2, "temperature": 0, "ignore_eos": True}, prompts,
                                False, -1, 0)

    def admission_order(sched, late_step: int) -> list[str]:
        now = [0.0]
        sched.clock = lambda: now[0]
        for r in reqs:
            sched.add_request(r)
        order, steps = [], 0
        now[0] = 0.5
        while sched.has_work():
            sched.step()
            steps += 1
            if steps == late_step:
                now[0] = 2.0
            order += [r.rid for r in sched.running if r.rid not in order]
        sched.check_invariants()
        return order

    order = eng.run_on_driver(lambda s: admission_order(s, late_step=1))
    assert order[0] != reqs[0].rid and order[1] == reqs[0].rid, order
    eng.shutdown()
