"""Randomized simulation of KVManager (the simulator is tests/kv_sim.py): requests driven the
way the scheduler drives them, with the memory invariants checked after every step.  It runs
both as a hypothesis RuleBasedStateMachine (shrinking) and as a seeded random fuzzer (long
weighted runs, many seeds)."""
from __future__ import annotations

import random
from collections import Counter

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from tests.helpers.kv_sim import HypChoice, KVSim, RandChoice


# --------------------------------------------------------------------------- hypothesis
class KVManagerMachine(RuleBasedStateMachine):
    DISABLE = False

    def __init__(self) -> None:
        super().__init__()
        self.sim = KVSim(self.DISABLE)

    @rule(data=st.data(), op=st.sampled_from(KVSim.OPS))
    def op(self, data, op):
        self.sim.step(op, HypChoice(data))

    @invariant()
    def memory_invariants(self):
        self.sim.check()

    def teardown(self):
        self.sim.drain()


_MACHINE_SETTINGS = settings(max_examples=150, stateful_step_count=50, deadline=None,
                             suppress_health_check=[HealthCheck.too_slow])
KVManagerMachine.TestCase.settings = _MACHINE_SETTINGS
TestKVManagerMachine = KVManagerMachine.TestCase


class KVManagerNoCacheMachine(KVManagerMachine):
    """Same with a NoPrefixCache: nothing is ever cached or locked."""

    DISABLE = True


KVManagerNoCacheMachine.TestCase.settings = settings(_MACHINE_SETTINGS, max_examples=25)
TestKVManagerNoCacheMachine = KVManagerNoCacheMachine.TestCase


# --------------------------------------------------------------------------- seeded fuzzer
FUZZ_WEIGHTS = {"admit": 4, "alloc_next": 4, "compute": 5, "cache_unfinished": 1, "abort_step": 0.5,
                "finish": 1.5, "retract": 0.7, "evict": 0.7, "match_random": 1, "flush": 0.1}
FUZZ_SEEDS = 40
FUZZ_STEPS = 400


def run_fuzz(seed: int, disable: bool = False, steps: int = FUZZ_STEPS, sim_cls: type[KVSim] = KVSim) -> KVSim:
    rng = random.Random(seed)
    sim, c = sim_cls(disable), RandChoice(rng)
    ops, weights = list(FUZZ_WEIGHTS), list(FUZZ_WEIGHTS.values())
    trace = []
    for _ in range(steps):
        op = rng.choices(ops, weights)[0]
        trace.append(op)
        try:
            sim.step(op, c)
            sim.check()
        except AssertionError as e:
            raise AssertionError(f"seed {seed}, step {len(trace)} ({op}); last ops {trace[-8:]}: {e}") from e
    sim.drain()
    return sim


def test_kv_manager_fuzz():
    """Seeded random fuzzer: FUZZ_SEEDS runs of FUZZ_STEPS weighted operations each, with the
    invariants checked after every operation; also asserts the runs reached the interesting
    paths, so a change that makes them unreachable fails here instead of passing silently."""
    events: Counter = Counter()
    for seed in range(FUZZ_SEEDS):
        events += run_fuzz(seed).events
    for name in ("alloc_slots failed", "alloc_slots evicted", "cache_unfinished rewrote a row",
                 "admitted with a cache hit", "flush refused", "readmit"):
        assert events[name] > 0, f"the fuzzer never reached {name!r}: {dict(events)}"


def test_kv_manager_fuzz_no_cache():
    for seed in range(4):
        run_fuzz(1000 + seed, disable=True)
