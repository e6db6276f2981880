"""KVManager through its interface, with both prefix caches (RadixCache, NoPrefixCache).

Each scenario drives requests the way the scheduler does (match_and_lock -> admit or unlock;
alloc_extend / make_room + alloc_decode; the caller advances ``kv_len`` after a step;
cache_unfinished; release on finish or retraction) and checks the memory invariants after
every step.  The randomized simulation of the same interface is in test_kv_manager_fuzz.py.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.helpers.kv_helpers import make_kv
from radixserve.mem_cache.invariants import check_memory_invariants
from radixserve.sampling_params import SamplingParams
from radixserve.scheduler.kv_manager import KVManager
from radixserve.scheduler.policy import order_waiting
from radixserve.scheduler.req import Req

CACHES = pytest.mark.parametrize("disable", [False, True], ids=["radix", "no_prefix"])


def make(num_slots: int = 32, rows: int = 4, disable: bool = False) -> KVManager:
    return KVManager(num_slots, rows, 64, disable_radix_cache=disable)


def req(rid: str, ids: list[int]) -> Req:
    return Req(rid, list(ids), SamplingParams(max_new_tokens=8))


def prefill(kv: KVManager, r: Req, chunk: int | None = None) -> int:
    """Admit ``r`` with its cached prefix and compute (the first ``chunk`` of) the rest."""
    m = kv.match_and_lock(r)
    n = r.fill_len - m.length if chunk is None else chunk
    assert kv.admit(r, m, n)
    row = kv.row(r)[: m.length + n].tolist()
    assert len(set(row)) == len(row) and 0 not in row
    r.kv_len += n
    kv.check_invariants()
    return m.length


def decode(kv: KVManager, reqs: list[Req], token: int = 9) -> None:
    """One decode step: sample a token for each, then compute it."""
    for r in reqs:
        r.output_ids.append(token)
    assert kv.make_room(len(reqs))
    kv.alloc_decode(reqs)
    kv.check_invariants([(kv.row(r)[r.cached_len: r.kv_len + 1].astype(np.int64), r.last_node) for r in reqs])
    for r in reqs:
        r.kv_len += 1
    kv.check_invariants()


@CACHES
def test_admit_extend_decode_release(disable):
    kv = make(disable=disable)
    a = req("a", [1, 2, 3, 4, 5, 6])
    assert prefill(kv, a, chunk=4) == 0
    assert kv.cache_unfinished(a) is False  # first to cache: nothing to rewrite
    assert a.cached_len == (0 if disable else 4)
    assert kv.alloc_extend([(a, 2)])  # the second chunk
    a.kv_len += 2
    kv.check_invariants()
    kv.cache_unfinished(a)
    decode(kv, [a])
    decode(kv, [a])
    assert a.kv_len == 8 and kv.free_slots() == kv.capacity - 8
    b = req("b", [1, 2, 3, 4, 7])
    assert prefill(kv, b) == (0 if disable else 4)  # shares a's first four tokens
    decode(kv, [a, b])
    s = kv.stats()
    assert s["protected_size"] == (0 if disable else 6) and s["num_slots"] == kv.capacity
    for r in (a, b):
        kv.release(r)
        assert (r.row, r.last_node, r.kv_len, r.cached_len, r.on_worker) == (None, None, 0, 0, False)
        kv.check_invariants()
    s = kv.stats()
    assert s["protected_size"] == 0
    assert s["cache_size"] == (0 if disable else 11)  # a: 9 computed tokens, b: 2 more
    assert kv.free_slots() + s["evictable_size"] == kv.available() == kv.capacity
    assert kv.held() == []


@CACHES
def test_retract_then_readmit(disable):
    kv = make(disable=disable)
    a = req("a", [5, 6, 7, 8, 9])
    prefill(kv, a)
    decode(kv, [a])
    before = kv.free_slots()
    kv.release(a)  # a retraction: the computed prefix stays cached (radix) or is freed
    kv.check_invariants()
    assert kv.free_slots() == before + (6 if disable else 0)
    a.output_ids.append(3)  # the token sampled by the last step, not computed yet
    hit = prefill(kv, a)
    assert hit == (0 if disable else 6) and a.kv_len == a.fill_len
    kv.release(a)
    kv.check_invariants()


@CACHES
def test_allocation_failures_take_nothing(disable):
    kv = make(num_slots=12, disable=disable)  # 11 usable slots
    a = req("a", list(range(1, 9)))
    prefill(kv, a)  # 8 held
    b = req("b", [20, 21, 22, 23, 24])
    m = kv.match_and_lock(b)
    free = kv.free_slots()
    assert kv.admit(b, m, 5) is False and b.row is None and kv.free_slots() == free
    kv.unlock(m)
    kv.check_invariants()
    assert kv.alloc_extend([(a, 4)]) is False and kv.free_slots() == free
    assert not kv.make_room(4) and kv.make_room(3)
    kv.check_invariants()
    assert kv.alloc_extend([(a, 2)])
    kv.free_tail(a, 2)  # the step did not run
    assert kv.free_slots() == free
    kv.release(a)
    kv.check_invariants()
    # radix: a's 8 tokens are cached and evictable, so b fits by evicting them
    m = kv.match_and_lock(b)
    assert kv.admit(b, m, 5)
    assert kv.stats()["evicted_tokens"] == (0 if disable else 8)
    b.kv_len += 5
    kv.release(b)
    kv.check_invariants()


def test_radix_eviction_frees_only_unlocked_tokens():
    kv = make(num_slots=12)
    a, b = req("a", [1, 2, 3, 4, 5, 6]), req("b", [7, 8, 9])
    prefill(kv, a)
    prefill(kv, b)
    kv.cache_unfinished(a)
    kv.release(b)  # 3 evictable, a's 6 locked, 2 free
    assert kv.available() == 5 and kv.free_slots() == 2
    assert not kv.make_room(6) and kv.make_room(5)
    assert kv.free_slots() == 5 and kv.stats()["evicted_tokens"] == 3
    assert kv.flush() is False  # a locks its prefix
    kv.check_invariants()
    kv.release(a)
    assert kv.flush() is True and kv.stats()["cache_size"] == 0 and kv.free_slots() == kv.capacity
    kv.check_invariants()


@CACHES
def test_lpm_order_through_match_len(disable):
    kv = make(disable=disable)
    warm = req("w", [1, 2, 3, 4, 5, 6])
    prefill(kv, warm)
    kv.release(warm)
    waiting = [req("x", [9, 9, 9]), req("y", [1, 2, 9]), req("z", [1, 2, 3, 4, 5, 9])]
    order = [r.rid for r in order_waiting(waiting, kv, "lpm", 128)]
    assert order == (["x", "y", "z"] if disable else ["z", "y", "x"])
    assert [r.rid for r in order_waiting(waiting, kv, "fcfs", 128)] == ["x", "y", "z"]
    kv.check_invariants()


@CACHES
def test_invariant_checker_catches_a_double_free(disable):
    kv = make(disable=disable)
    a = req("a", [1, 2, 3])
    prefill(kv, a)
    a.kv_len -= 1
    kv.free_tail(a, 1)  # a slot the request still has computed KV in: now free AND in the row
    a.kv_len += 1
    with pytest.raises(AssertionError, match="owned twice"):
        kv.check_invariants()


def test_no_prefix_manager_never_caches():
    kv = make(disable=True)
    a, b = req("a", [1, 2, 3, 4]), req("b", [1, 2, 3, 4])
    prefill(kv, a)
    assert kv.cache_unfinished(a) is False and a.cached_len == 0
    assert prefill(kv, b) == 0  # the same prompt: no hit
    kv.record_hit(0, 4)
    decode(kv, [a, b])
    assert kv.stats()["cache_size"] == 0 and kv.stats()["hit_rate"] == 0.0
    assert a.last_node is b.last_node  # both on the root, which is never locked
    for r in (a, b):
        kv.release(r)
    assert kv.free_slots() == kv.capacity
    kv.check_invariants()


@CACHES
def test_internals_stay_behind_the_interface(disable):
    """The scheduler reaches the table, the allocator and the cache only through KVManager."""
    kv = make(disable=disable)
    for name in ("allocator", "cache", "req_to_token", "alloc_slots", "extend_row", "free_request_tail"):
        assert not hasattr(kv, name), name
    scheduler_src = (Path(__file__).parents[2] / "radixserve/scheduler/scheduler.py").read_text()
    for private in ("kv._allocator", "kv._cache", "kv._rows", ".table["):
        assert private not in scheduler_src, private
    kv.check_invariants()


# --------------------------------------------------------------------------- over parts the test keeps
def test_cache_unfinished_replaces_duplicates_with_tree_slots():
    """Two requests computing the same prompt concurrently: the second one to cache gets its
    row rewritten to the tree's slots and its duplicate slots freed."""
    kv, allocator, cache, _ = make_kv(16, 4, 32)
    a = Req("a", [1, 2, 3, 4], SamplingParams())
    b = Req("b", [1, 2, 3, 4, 5], SamplingParams())
    for r in (a, b):
        match = kv.match_and_lock(r)
        assert match.slots.size == 0
        assert kv.admit(r, match, r.fill_len)
        r.kv_len = r.fill_len
    a_row = kv.row(a)[:4].tolist()
    b_row = kv.row(b)[:5].tolist()
    assert kv.cache_unfinished(a) is False  # first to cache: nothing to rewrite
    assert a.cached_len == 4 and a.last_node.lock_ref == 1
    free_before = set(allocator.free_slots().tolist())
    assert kv.cache_unfinished(b) is True
    assert kv.row(b)[:5].tolist() == a_row + b_row[4:]
    assert set(allocator.free_slots().tolist()) - free_before == set(b_row[:4])
    assert b.cached_len == 5 and b.last_node.key == [5] and b.last_node.parent is a.last_node
    assert a.last_node.lock_ref == 2
    check_memory_invariants(allocator, cache, [(kv.row(r)[r.cached_len: r.kv_len].astype(np.int64), r.last_node)
                                               for r in (a, b)])
    kv.release(a)
    kv.release(b)
    check_memory_invariants(allocator, cache, [])
    assert cache.protected_size == 0 and cache.evictable_size == 5
    cache.evict(100)
    assert allocator.available_size() == 15


def test_flush_with_a_running_request_on_the_root():
    """Regression: a request with nothing cached points at the root; flush must keep it."""
    kv, allocator, cache, _ = make_kv(16, 4, 32)
    cache.insert([7, 8], allocator.alloc(2))
    r = Req("a", [1, 2, 3], SamplingParams())
    assert kv.admit(r, kv.match_and_lock(r), 3)
    r.kv_len = 3
    assert kv.flush() is True and cache.total_size() == 0
    kv.cache_unfinished(r)
    check_memory_invariants(allocator, cache, [(kv.row(r)[r.cached_len:r.kv_len].astype(np.int64), r.last_node)])
    kv.release(r)
    check_memory_invariants(allocator, cache)
