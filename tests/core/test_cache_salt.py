"""Cache isolation (``cache_salt``): keys under different salts never share a node or a KV
slot, in the RadixCache, the KVManager (match, admit, cache, release, evict), the LPM
policy, the in-batch prefix filter and the speculative continuation; the memory invariants
hold throughout, also after eviction."""
from __future__ import annotations

import random

import pytest

from tests.helpers.kv_helpers import T, make_cache, make_kv
from radixserve.mem_cache.continuation import continuation
from radixserve.mem_cache.invariants import check_memory_invariants
from radixserve.sampling_params import SamplingParams
from radixserve.scheduler.policy import InBatchPrefixFilter, order_waiting
from radixserve.scheduler.req import Req


def req(rid: str, ids: list[int], salt: str | None) -> Req:
    return Req(rid, list(ids), SamplingParams(max_new_tokens=4, cache_salt=salt))


def test_salts_never_match_each_other():
    cache, _ = make_cache()
    assert cache.insert([1, 2, 3], T(10, 11, 12)) == 0
    assert cache.insert([1, 2, 3], T(20, 21, 22), salt="a") == 0  # same tokens, new namespace
    assert cache.insert([1, 2, 4], T(30, 31, 32), salt="b") == 0
    assert cache.match_prefix([1, 2, 3])[0].tolist() == [10, 11, 12]
    assert cache.match_prefix([1, 2, 3], "a")[0].tolist() == [20, 21, 22]
    assert cache.match_prefix([1, 2, 3], "b")[0].tolist() == [30, 31]
    slots, node = cache.match_prefix([1, 2, 3], "c")
    assert slots.size == 0 and node is cache.root
    assert cache.insert([1, 2, 3, 5], T(20, 21, 22, 25), salt="a") == 3  # within a namespace: shared
    # a split inside one namespace keeps the node in it
    slots, node = cache.match_prefix([1], "a")
    assert slots.tolist() == [20] and node.salt == "a" and node.parent is cache.root
    assert all(c.salt == "a" for c in node.children.values())
    assert cache.total_size() == 3 + 4 + 3


def test_salted_eviction_and_locks_keep_invariants():
    kv, alloc, cache, _ = make_kv(num_slots=24, max_rows=4, max_ctx=32)
    reqs = [req("a0", [1, 2, 3, 4, 5], "a"), req("b0", [1, 2, 3, 4, 5], "b"), req("n0", [1, 2, 3, 4, 5], None)]
    for r in reqs:
        m = kv.match_and_lock(r)
        assert m.length == 0  # nothing shared across namespaces
        assert kv.admit(r, m, r.fill_len)
        r.kv_len = r.fill_len
        kv.check_invariants()
        kv.cache_unfinished(r)
        kv.check_invariants()
    for r in reqs:
        kv.release(r)
        kv.check_invariants()
    assert cache.evictable_size == 15 and len(cache.root.children) == 3
    # the same tenant hits its own prefix; another salt does not
    a1, c1 = req("a1", [1, 2, 3, 4, 9], "a"), req("c1", [1, 2, 3, 4, 9], "c")
    assert kv.match_len(a1) == 4 and kv.match_len(c1) == 0
    m = kv.match_and_lock(a1)
    assert m.length == 4 and kv.admit(a1, m, 1)
    a1.kv_len = 5
    # evict everything evictable: the locked "a" path survives, the others go
    assert cache.evict(100) == 11  # b and None (5 each), the unlocked tail [5] of "a"
    kv.check_invariants()
    assert [n.salt for n in cache.root.children.values()] == ["a"]
    assert kv.match_len(req("b1", [1, 2, 3, 4, 5], "b")) == 0
    kv.release(a1)
    kv.check_invariants()
    assert cache.flush() and cache.total_size() == 0 and alloc.available_size() == 23
    kv.check_invariants()


def test_random_salted_workload_keeps_invariants():
    rnd = random.Random(7)
    kv, alloc, cache, _ = make_kv(num_slots=64, max_rows=6, max_ctx=32)
    running: list[Req] = []
    for step in range(300):
        if running and (len(running) == 6 or rnd.random() < 0.4):
            kv.release(running.pop(rnd.randrange(len(running))))
        else:
            salt = rnd.choice([None, "a", "b"])
            ids = [rnd.randrange(3) for _ in range(rnd.randrange(2, 10))]
            r = req(f"r{step}", ids, salt)
            m = kv.match_and_lock(r)
            if not kv.admit(r, m, r.fill_len - m.length):
                kv.unlock(m)
                continue
            # every cached slot of the match belongs to a node of the request's namespace
            node = m.node
            while node is not cache.root:
                assert node.salt == salt
                node = node.parent
            r.kv_len = r.fill_len
            kv.cache_unfinished(r)
            running.append(r)
        kv.check_invariants()
    for r in running:
        kv.release(r)
    kv.check_invariants()
    cache.evict(10**6)
    check_memory_invariants(alloc, cache)
    assert alloc.available_size() == 63


def test_policy_filter_and_continuation_use_the_salt():
    kv, _, cache, _ = make_kv(num_slots=32, max_rows=4, max_ctx=32)
    cached = req("x", [5, 6, 7, 8, 9], "a")
    m = kv.match_and_lock(cached)
    assert kv.admit(cached, m, 5)
    cached.kv_len = 5
    kv.release(cached)
    same, other = req("s", [5, 6, 7, 8, 1], "a"), req("o", [5, 6, 7, 8, 1], "b")
    # LPM: only the same-namespace request ranks by its hit
    assert order_waiting([other, same], kv, "lpm", 128) == [same, other]
    f = InBatchPrefixFilter(threshold=2)
    f.add([1, 2, 3, 4], "a")
    assert f.should_defer([1, 2, 3, 4, 5], 0, "a") and not f.should_defer([1, 2, 3, 4, 5], 0, "b")
    # continuation: after [5, 6] the tree holds [7, 8, 9] for "a" only, also from the root
    assert continuation(cache.root, [5, 6], 3, "a") == [7, 8, 9]
    assert continuation(cache.root, [5, 6], 3, "b") == []
    assert continuation(cache.root, [], 3, None) == []  # the root's other children are not followed


@pytest.mark.parametrize("bad", ["", 5, "x" * 257])
def test_cache_salt_is_validated(bad):
    with pytest.raises(ValueError, match="sampling_params.cache_salt"):
        SamplingParams(cache_salt=bad).verify(100)


def test_engine_requests_with_other_salts_never_hit(tiny_dir):
    from tests.helpers.models import make_engine

    eng = make_engine(tiny_dir, max_total_tokens=2048)
    try:
        ids = list(range(300, 340))

        def hit(salt):
            sp = {"max_new_tokens": 1, "temperature": 0, **({"cache_salt": salt} if salt else {})}
            return eng.generate(input_ids=ids, sampling_params=sp)["meta_info"]["cached_tokens"]

        assert hit("a") == 0 and hit("a") > 0
        assert hit("b") == 0 and hit(None) == 0 and hit(None) > 0 and hit("b") > 0
        eng.check_invariants()
    finally:
        eng.shutdown()
