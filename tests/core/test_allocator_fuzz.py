"""Property tests of SlotAllocator and ReqToTokenPool under random alloc/free sequences.

Each is a hypothesis RuleBasedStateMachine checked against a plain-Python model (a set of
free slots / rows).  After every step: ``available_size()`` is exact and the handed-out
slots are disjoint from each other and from the free ones.
"""
from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from radixserve.mem_cache.allocator import SlotAllocator
from radixserve.mem_cache.req_to_token import ReqToTokenPool

SETTINGS = settings(max_examples=60, stateful_step_count=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


# --------------------------------------------------------------------------- state machines
class SlotAllocatorMachine(RuleBasedStateMachine):
    NUM_SLOTS = 24

    def __init__(self) -> None:
        super().__init__()
        self.a = SlotAllocator(self.NUM_SLOTS)
        self.model_free = set(range(1, self.NUM_SLOTS))
        self.held: list[np.ndarray] = []  # allocations not (fully) freed yet

    def _held_slots(self) -> list[int]:
        return [s for t in self.held for s in t.tolist()]

    @rule(n=st.integers(0, 30))
    def alloc(self, n):
        before = self.a.available_size()
        out = self.a.alloc(n)
        if n > len(self.model_free):
            assert out is None, f"alloc({n}) with {len(self.model_free)} free must fail"
            assert self.a.available_size() == before, "failed alloc took slots"
            return
        assert out is not None, f"alloc({n}) failed with {len(self.model_free)} free"
        assert out.dtype == np.int64 and out.ndim == 1 and out.size == n
        got = out.tolist()
        assert 0 not in got, "slot 0 (padding) handed out"
        assert len(set(got)) == n, f"duplicate slots in one alloc: {got}"
        assert set(got) <= self.model_free, f"handed out slots that are not free: {set(got) - self.model_free}"
        self.model_free -= set(got)
        if n:
            self.held.append(out.copy())

    @precondition(lambda self: self.held)
    @rule(data=st.data(), as_int32=st.booleans())
    def free(self, data, as_int32):
        i = data.draw(st.integers(0, len(self.held) - 1))
        t = self.held.pop(i)
        k = data.draw(st.integers(0, t.size))
        perm = np.array(data.draw(st.permutations(range(t.size))), dtype=np.int64)
        give, keep = t[perm[:k]], t[perm[k:]]
        self.a.free(give.astype(np.int32) if as_int32 else give.copy())
        self.model_free |= set(give.tolist())
        if keep.size:
            self.held.append(keep)

    @rule()
    def free_nothing(self):
        self.a.free(np.empty(0, dtype=np.int64))

    @rule()
    def merge_then_alloc_lowest(self):
        """After free_slots() (which merges the freed ones) alloc returns the lowest free slots."""
        free = self.a.free_slots().tolist()
        assert free == sorted(self.model_free), "free_slots() disagrees with the model"
        if free:
            k = min(3, len(free))
            out = self.a.alloc(k)
            assert out.tolist() == free[:k]
            self.model_free -= set(free[:k])
            self.held.append(out.copy())

    @rule()
    def reset(self):
        self.a.reset()
        self.model_free = set(range(1, self.NUM_SLOTS))
        self.held = []
        assert self.a.free_slots().tolist() == list(range(1, self.NUM_SLOTS))

    @invariant()
    def exact_accounting(self):
        assert self.a.available_size() == len(self.model_free)
        held = self._held_slots()
        assert len(held) == len(set(held)), "a slot is held twice"
        assert not set(held) & self.model_free
        assert len(held) + len(self.model_free) == self.NUM_SLOTS - 1, "slots leaked"

    def teardown(self):
        for t in self.held:
            self.a.free(t)
        assert self.a.free_slots().tolist() == list(range(1, self.NUM_SLOTS))


SlotAllocatorMachine.TestCase.settings = SETTINGS
TestSlotAllocatorMachine = SlotAllocatorMachine.TestCase


class ReqToTokenPoolMachine(RuleBasedStateMachine):
    SIZE = 5

    def __init__(self) -> None:
        super().__init__()
        self.p = ReqToTokenPool(self.SIZE, 8)
        self.used: set[int] = set()

    @rule()
    def alloc(self):
        row = self.p.alloc()
        if len(self.used) == self.SIZE:
            assert row is None
            return
        assert row is not None and 0 <= row < self.SIZE
        assert row not in self.used, f"row {row} handed out twice"
        self.used.add(row)

    @precondition(lambda self: self.used)
    @rule(data=st.data())
    def free(self, data):
        row = data.draw(st.sampled_from(sorted(self.used)))
        self.used.remove(row)
        self.p.free(row)

    @rule()
    def reset(self):
        self.p.reset()
        self.used = set()

    @invariant()
    def exact(self):
        assert self.p.available_size() == self.SIZE - len(self.used)


ReqToTokenPoolMachine.TestCase.settings = settings(SETTINGS, max_examples=30)
TestReqToTokenPoolMachine = ReqToTokenPoolMachine.TestCase
