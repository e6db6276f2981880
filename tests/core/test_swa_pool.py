"""The sliding-window pool on the scheduler's side (``mem_cache/swa_slots.py``,
``mem_cache/swa_reclaim.py``, ``KVManager`` with ``swa``): every slot handed out has a sliding
slot, freeing frees both, sliding KV no window reads is reclaimed when the pool is short (own
tokens first, then unneeded tree nodes), a cached prefix is cut where its last ``window`` tokens
lost their sliding KV, a request's duplicate gives the tree its sliding KV back, and the
randomized simulation keeps both pools' invariants and every window's KV."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from radixserve.mem_cache.swa_slots import SwaSlotAllocator, usable_prefix
from radixserve.sampling_params import SamplingParams
from radixserve.scheduler.kv_manager import KVManager
from radixserve.scheduler.req import Req
from tests.core.test_kv_manager_fuzz import run_fuzz
from tests.helpers.kv_sim_swa import SwaKVSim


def test_allocator_takes_and_frees_both_slots():
    a = SwaSlotAllocator(10, 5, 2)
    got = a.alloc(4)
    assert got is not None and (a.swa_of[got] > 0).all() and a.sliding_available() == 0
    assert a.alloc(1) is None and a.available_size() == 5, "short of sliding slots: nothing taken"
    assert a.release_sliding(got[:2]) == 2 and a.release_sliding(got[:2]) == 0
    a.free(got)
    assert a.available_size() == 9 and a.sliding_available() == 4 and int(a.swa_of.sum()) == 0


@pytest.mark.parametrize("present,window,want", [
    ("1111111", 3, 7), ("1101111", 3, 7), ("1111011", 3, 4), ("1111101", 3, 5), ("0111111", 8, 0),
    ("1111110", 2, 6), ("1011111", 1, 7), ("", 4, 0)])
def test_usable_prefix(present, window, want):
    swa_of = np.array([0] + [int(c) for c in present], dtype=np.int64)
    assert usable_prefix(swa_of, np.arange(1, len(present) + 1), window) == want


def _req(rid: str, ids: list[int]) -> Req:
    return Req(rid, list(ids), SamplingParams(max_new_tokens=4))


def _run(kv: KVManager, r: Req, chunk: int) -> None:
    """Admit ``r`` and prefill it chunk by chunk, caching each chunk as the scheduler does."""
    m = kv.match_and_lock(r)
    n = min(chunk, r.fill_len - m.length)
    assert kv.admit(r, m, n)
    r.kv_len += n
    kv.cache_unfinished(r)
    while r.kv_len < r.fill_len:
        n = min(chunk, r.fill_len - r.kv_len)
        assert kv.alloc_extend([(r, n)])
        r.kv_len += n
        kv.cache_unfinished(r)
        kv.check_invariants()


def test_a_long_prompt_runs_in_a_sliding_pool_smaller_than_it():
    """A 200-token prompt in 16-token chunks through 40 sliding slots (window 8): the chunks
    reclaim the sliding KV the window left behind, and the window's KV stays."""
    kv = KVManager(300, 4, 512, swa=(41, 8))
    r = _req("a", list(range(1, 201)))
    _run(kv, r, 16)
    swa_of = kv._allocator.swa_of
    row = kv.row(r)[:200].astype(np.int64)
    assert bool((swa_of[row[-8:]] > 0).all()) and int((swa_of[row] > 0).sum()) <= 40
    kv.release(r)
    kv.check_invariants()


def test_a_match_is_cut_where_the_sliding_kv_is_gone_and_a_duplicate_restores_it():
    kv = KVManager(300, 4, 512, swa=(41, 8))
    a = _req("a", list(range(1, 101)))
    _run(kv, a, 16)
    kv.release(a)
    alloc = kv._allocator
    tree_slots = kv._cache.match_prefix(list(range(1, 101)))[0]
    assert kv.match_len(_req("x", list(range(1, 101)) + [3])) == 100, "the tail's sliding KV was kept"
    alloc.release_sliding(tree_slots[96:])  # as a reclaim would
    b = _req("b", list(range(1, 101)) + [7, 7])
    m = kv.match_and_lock(b)
    assert m.length <= 96 and bool((alloc.swa_of[m.slots[-8:]] > 0).all()), "cut before the reclaimed tokens"
    # the tree keeps every token's full slot; b recomputes the rest and gives the tree its sliding KV
    assert kv.admit(b, m, b.fill_len - m.length)
    b.kv_len = b.fill_len
    kv.release(b)
    kv.check_invariants()
    assert bool((alloc.swa_of[tree_slots[-8:]] > 0).all())
    assert kv.match_len(_req("d", list(range(1, 101)) + [5])) == 100


def test_tree_sliding_kv_in_a_running_window_is_not_reclaimed():
    """A shared prefix locked by a request whose window still reads its tail keeps that tail."""
    kv = KVManager(400, 4, 512, swa=(41, 8))
    a = _req("a", list(range(1, 33)))
    _run(kv, a, 32)
    b = _req("b", list(range(1, 33)) + list(range(100, 130)))
    m = kv.match_and_lock(b)
    assert m.length == 32 and kv.admit(b, m, 1)
    b.kv_len += 1
    kv.release(a)
    # a third request forces reclaiming: the prefix's head goes, the tail b's window reads stays
    c = _req("c", list(range(200, 230)))
    _run(kv, c, 30)
    swa_of = kv._allocator.swa_of
    assert bool((swa_of[kv.row(b)[25:33].astype(np.int64)] > 0).all()) and not bool((swa_of[kv.row(b)[:20].astype(np.int64)] > 0).any())
    kv.check_invariants()


def test_swa_simulation_keeps_both_pools_and_every_window():
    events: Counter = Counter()
    for seed in range(12):
        events += run_fuzz(2000 + seed, seed % 4 == 3, 300, SwaKVSim).events
    for name in ("sliding pool short", "sliding slots reclaimed", "admitted with a cache hit"):
        assert events[name] > 0, f"the simulation never reached {name!r}: {dict(events)}"
