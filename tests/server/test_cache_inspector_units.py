"""The cache inspector's scheduler side, without a server: ``CacheStats`` windows (fake clock),
per-node hit counts, the node count accounting, and ``tree_snapshot``'s limits, ordering,
omitted counts, scan budget and privacy (no token ids by default, never for salted nodes)."""
from __future__ import annotations

import numpy as np

from tests.helpers.models import walk
from tests.helpers.kv_helpers import make_cache, make_kv
from radixserve.mem_cache.cache_stats import CacheStats
from radixserve.mem_cache.invariants import check_memory_invariants
from radixserve.mem_cache.tree_inspect import namespace_id, tree_snapshot
from radixserve.sampling_params import SamplingParams
from radixserve.scheduler.req import Req


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def slots(start: int, n: int) -> np.ndarray:
    return np.arange(start, start + n, dtype=np.int64)


def test_cache_stats_windows_and_totals():
    clock = FakeClock()
    st = CacheStats(clock)
    s = st.snapshot()["windows"]
    assert s["last_1m"]["hit_rate"] is None and s["since_start"]["requests"] == 0
    st.record_hit(0, 100)  # t = 1000
    clock.t += 200
    st.record_hit(50, 100)  # t = 1200
    st.record_eviction(2, 30)
    clock.t += 30
    st.record_hit(90, 100)  # t = 1230
    st.record_eviction(0, 0)  # nothing evicted: not an event
    w = st.snapshot()["windows"]
    assert (w["last_1m"]["prompt_tokens"], w["last_1m"]["cached_tokens"], w["last_1m"]["requests"]) == (200, 140, 2)
    assert w["last_1m"]["hit_rate"] == 0.7
    assert (w["last_1m"]["evicted_nodes"], w["last_1m"]["evicted_tokens"]) == (2, 30)
    assert (w["last_5m"]["prompt_tokens"], w["last_5m"]["cached_tokens"]) == (300, 140)
    assert w["since_start"]["hit_rate"] == 140 / 300 and w["since_start"]["requests"] == 3
    clock.t += 80  # t = 1310
    w = st.snapshot()["windows"]
    assert w["last_1m"]["prompt_tokens"] == 0 and w["last_1m"]["hit_rate"] is None
    assert w["last_5m"]["prompt_tokens"] == 200  # the t = 1000 hit is older than 5 min
    clock.t += 1000  # every bucket ages out; the totals stay
    st.record_hit(1, 2)
    w = st.snapshot()["windows"]
    assert w["last_5m"]["prompt_tokens"] == 2 and w["since_start"]["prompt_tokens"] == 302
    assert len(st._buckets) == 1


def test_hit_counts_follow_matches_and_survive_splits():
    cache, _ = make_cache()
    cache.insert(list(range(10)), slots(1, 10))
    _, node = cache.match_prefix(list(range(10)))
    cache.record_hit(10, 12, node)
    cache.record_hit(10, 12, node)
    _, mid = cache.match_prefix([0, 1, 2, 3, 99])  # splits the node after 4 tokens
    cache.record_hit(4, 5, mid)
    upper = cache.root.children[0]
    assert upper.key == [0, 1, 2, 3] and upper.hit_count == 3
    assert upper.children[4].hit_count == 2
    cache.record_hit(0, 7, cache.root)  # a miss counts on no node
    assert upper.hit_count == 3 and cache.counters.totals["requests"] == 4
    assert cache.num_nodes == 2 == len(cache.all_nodes())


def test_node_count_accounting_through_kv_manager():
    kv, allocator, cache, _ = make_kv(64, 4, 64)
    for i, ids in enumerate([[1, 2, 3, 4, 5], [1, 2, 3, 9], [1, 2, 7], [8]]):
        r = Req(f"r{i}", ids, SamplingParams(max_new_tokens=1))
        m = kv.match_and_lock(r)
        assert kv.admit(r, m, r.fill_len - m.length)
        kv.record_hit(m.length, len(ids), m.node)
        r.kv_len = r.fill_len
        kv.release(r)
        kv.check_invariants()  # includes num_nodes == len(all_nodes())
    assert cache.num_nodes == len(cache.all_nodes()) == 6
    assert kv.make_room(63)  # evicts everything
    check_memory_invariants(allocator, cache, [])
    assert cache.num_nodes == 0
    st = kv.cache_stats()
    assert st["windows"]["since_start"]["evicted_nodes"] == 6
    assert st["windows"]["since_start"]["evicted_tokens"] == 8
    assert st["kv"] == {"num_slots": 63, "free_slots": 63, "cached_slots": 0, "held_slots": 0, "used_fraction": 0.0}


def build_tree():
    """A shared 40-token prefix with three branches (20, 10 and 5 tokens), a salted copy of a
    prefix, and an unrelated 3-token prompt."""
    cache, _ = make_cache()
    base = list(range(100, 140))
    at = 1
    for tail in (list(range(200, 220)), list(range(300, 310)), list(range(400, 405))):
        key = base + tail
        cache.insert(key, slots(at, len(key)))
        at += len(key)
    cache.insert([7, 8, 9], slots(at, 3))
    cache.insert(base[:12], slots(at + 3, 12), salt="tenant-a")
    return cache


def test_tree_snapshot_shape_order_and_sizes():
    cache = build_tree()
    _, node = cache.match_prefix(list(range(100, 140)) + list(range(300, 310)))
    cache.record_hit(50, 50, node)
    cache.inc_lock_ref(node)
    t = tree_snapshot(cache, max_depth=8, max_nodes=100)
    root = t["root"]
    assert (t["cache"], t["tree_tokens"], t["tree_nodes"], t["scan_complete"]) == ("radix", 90, 6, True)
    assert t["returned_nodes"] == t["scanned_nodes"] == 6
    assert root["subtree_tokens"] == 90 and root["subtree_nodes"] == 6 and root["hit_count"] == 1
    top = root["children"]
    assert [c["subtree_tokens"] for c in top] == [75, 12, 3]  # biggest first
    shared = top[0]
    assert (shared["tokens"], shared["depth"], shared["hit_count"], shared["lock_count"]) == (40, 1, 1, 1)
    assert [c["tokens"] for c in shared["children"]] == [20, 10, 5]
    assert [c["prefix_tokens"] for c in shared["children"]] == [40, 40, 40]
    locked = shared["children"][1]
    assert (locked["hit_count"], locked["lock_count"]) == (1, 1)
    assert shared["children"][0]["lock_count"] == 0 and shared["children"][0]["hit_count"] == 0
    assert top[1]["namespace"] == namespace_id("tenant-a") and len(top[1]["namespace"]) == 12
    assert top[0]["namespace"] is None
    for n in walk(root):
        assert "token_ids" not in n and "text" not in n  # no ids unless asked
        assert n["omitted_children"] == 0 and n["omitted_tokens"] == 0
        assert n["last_access_s"] is None or n["last_access_s"] >= 0
    ids = [n["id"] for n in walk(root)]
    assert sorted(ids) == list(range(7))


def test_tree_snapshot_limits_and_omitted_counts():
    cache = build_tree()
    t = tree_snapshot(cache, max_depth=8, max_nodes=2)
    root = t["root"]
    assert t["returned_nodes"] == 2 == len(walk(root)) - 1
    # the two biggest subtrees: the shared prefix (75) and its biggest branch (25)... no: the
    # salted prefix (12) is smaller than the 20-token branch, so the branch comes second
    assert [c["subtree_tokens"] for c in root["children"]] == [75]
    shared = root["children"][0]
    assert [c["tokens"] for c in shared["children"]] == [20]
    assert (shared["omitted_children"], shared["omitted_tokens"]) == (2, 15)
    assert (root["omitted_children"], root["omitted_tokens"]) == (2, 15)
    t = tree_snapshot(cache, max_depth=1, max_nodes=100)
    assert all(n["depth"] <= 1 for n in walk(t["root"])) and t["returned_nodes"] == 3
    assert t["root"]["children"][0]["omitted_children"] == 3
    assert t["root"]["children"][0]["omitted_tokens"] == 35
    t = tree_snapshot(cache, max_depth=0, max_nodes=0)  # clamped to the smallest reply
    assert (t["max_depth"], t["max_nodes"], t["returned_nodes"]) == (1, 1, 1)


def test_tree_snapshot_tokens_only_when_asked_and_never_salted():
    cache = build_tree()
    cache.insert(list(range(1000, 1100)), slots(200, 100))
    t = tree_snapshot(cache, with_tokens=True)
    nodes = walk(t["root"])[1:]
    for n in nodes:
        if n["namespace"] is not None:
            assert "token_ids" not in n
        else:
            assert n["token_ids"] and len(n["token_ids"]) == min(64, n["tokens"])
            assert n["token_ids_truncated"] == (n["tokens"] > 64)
    long = next(n for n in nodes if n["tokens"] == 100)
    assert long["token_ids"] == list(range(1000, 1064))


def test_tree_snapshot_scan_budget_bounds_the_walk():
    cache, _ = make_cache()
    for i in range(50):
        cache.insert([5, i, i, i], slots(1 + 4 * i, 4))
    assert cache.num_nodes == 51
    t = tree_snapshot(cache, max_nodes=1000, scan_budget=10)
    assert not t["scan_complete"] and t["scanned_nodes"] == 10
    assert t["tree_nodes"] == 51 and t["tree_tokens"] == 151
    assert t["returned_nodes"] <= 51
    full = tree_snapshot(cache, max_nodes=1000)
    assert full["scan_complete"] and full["root"]["subtree_tokens"] == 151


def test_no_prefix_cache_snapshot_is_an_empty_tree():
    cache, _ = make_cache(disable=True)
    cache.record_hit(0, 7, cache.root)
    t = tree_snapshot(cache, with_tokens=True)
    assert (t["cache"], t["tree_tokens"], t["tree_nodes"], t["returned_nodes"]) == ("none", 0, 0, 0)
    assert t["root"]["children"] == [] and t["root"]["hit_count"] == 1
    w = cache.counters.snapshot()["windows"]["since_start"]
    assert (w["prompt_tokens"], w["cached_tokens"], w["hit_rate"]) == (7, 0, 0.0)
