"""RadixCache semantics (unit tests): prefix matching with node splits, insertion, lock
references, LRU eviction of whole leaves, flush and statistics.  NoPrefixCache is tested in
test_no_prefix_cache.py, the KVManager over both in test_kv_manager.py and
test_kv_manager_fuzz.py."""
from __future__ import annotations

import pytest

from tests.helpers.kv_helpers import T, make_cache
from radixserve.mem_cache.radix_cache import RadixCache
from radixserve.mem_cache.tree_node import TreeNode


def shape(cache: RadixCache, node: TreeNode | None = None):
    """Nested (key, value, children) description of the subtree for structural asserts."""
    node = cache.root if node is None else node
    return {k: (c.key, c.value.tolist(), shape(cache, c)) for k, c in sorted(node.children.items())}


# =========================================================================== unit tests
def test_match_prefix_splits_so_match_ends_on_node_boundary():
    cache, _ = make_cache()
    assert cache.insert([1, 2, 3, 4], T(10, 11, 12, 13)) == 0
    assert shape(cache) == {1: ([1, 2, 3, 4], [10, 11, 12, 13], {})}

    slots, node = cache.match_prefix([1, 2, 9])
    assert slots.tolist() == [10, 11]
    assert node.key == [1, 2] and node.value.tolist() == [10, 11]
    assert node.parent is cache.root and cache.root.children[1] is node
    lower = node.children[3]
    assert lower.key == [3, 4] and lower.value.tolist() == [12, 13] and lower.parent is node
    assert shape(cache) == {1: ([1, 2], [10, 11], {3: ([3, 4], [12, 13], {})})}
    assert cache.total_size() == cache.evictable_size == 4  # a split moves no tokens

    # a match ending exactly on a boundary splits nothing
    slots2, node2 = cache.match_prefix([1, 2])
    assert node2 is node and slots2.tolist() == [10, 11] and len(cache.all_nodes()) == 2
    # a longer key stops at the end of the tree
    slots3, node3 = cache.match_prefix([1, 2, 3, 4, 5, 6])
    assert slots3.tolist() == [10, 11, 12, 13] and node3 is lower
    # no match / empty key -> root
    for key in ([], [7], [2, 1]):
        s, n = cache.match_prefix(key)
        assert s.size == 0 and n is cache.root
    # a split inside the lower node keeps the lower node's identity at the bottom
    s4, n4 = cache.match_prefix([1, 2, 3])
    assert s4.tolist() == [10, 11, 12] and n4.key == [3] and n4.children[4] is lower
    assert lower.key == [4] and lower.parent is n4
    check_memory_invariants_tree_only(cache)


def check_memory_invariants_tree_only(cache: RadixCache) -> None:
    """Structure + size accounting of the tree alone (no allocator)."""
    ev = pr = 0
    seen = set()
    for n in cache.all_nodes():
        assert len(n.key) == n.value.size > 0
        assert n.parent.children[n.key[0]] is n
        for s in n.value.tolist():
            assert s not in seen
            seen.add(s)
        if n.lock_ref:
            pr += len(n.key)
        else:
            ev += len(n.key)
    assert (ev, pr) == (cache.evictable_size, cache.protected_size)


def test_insert_returns_length_already_cached():
    cache, rec = make_cache()
    assert cache.insert([1, 2, 3], T(10, 11, 12)) == 0
    assert cache.insert([1, 2, 3], T(20, 21, 22)) == 3  # fully cached: tree keeps its slots
    assert cache.match_prefix([1, 2, 3])[0].tolist() == [10, 11, 12]
    assert cache.insert([1, 2, 5, 6], T(30, 31, 32, 33)) == 2  # diverges after 2
    assert shape(cache) == {1: ([1, 2], [10, 11], {3: ([3], [12], {}), 5: ([5, 6], [32, 33], {})})}
    assert cache.evictable_size == 5
    assert cache.insert([1], T(40)) == 1  # a prefix of cached tokens: all cached
    assert cache.insert([9], T(50)) == 0
    assert cache.insert([], T()) == 0
    assert cache.total_size() == 6
    assert rec.batches == []  # insert never frees: duplicates are the caller's
    check_memory_invariants_tree_only(cache)


def test_insert_extending_an_existing_key():
    cache, _ = make_cache()
    assert cache.insert([1, 2], T(10, 11)) == 0
    leaf = cache.root.children[1]
    value = T(20, 21, 12, 13)
    assert cache.insert([1, 2, 3, 4], value) == 2
    assert cache.root.children[1] is leaf and leaf.key == [1, 2]  # not split, extended below
    assert shape(cache) == {1: ([1, 2], [10, 11], {3: ([3, 4], [12, 13], {})})}
    value[2:] = 99  # the tree stored a copy
    assert cache.match_prefix([1, 2, 3, 4])[0].tolist() == [10, 11, 12, 13]
    assert cache.evictable_size == 4


def test_lock_ref_propagates_to_the_root():
    cache, _ = make_cache()
    cache.insert([1, 2, 3, 4], T(10, 11, 12, 13))
    cache.insert([1, 2, 5], T(10, 11, 15))
    a = cache.root.children[1]
    b, c = a.children[3], a.children[5]
    assert (a.key, b.key, c.key) == ([1, 2], [3, 4], [5])
    assert (cache.evictable_size, cache.protected_size) == (5, 0)

    cache.inc_lock_ref(b)
    assert (a.lock_ref, b.lock_ref, c.lock_ref) == (1, 1, 0)
    assert (cache.evictable_size, cache.protected_size) == (1, 4)
    cache.inc_lock_ref(c)
    assert (a.lock_ref, b.lock_ref, c.lock_ref) == (2, 1, 1)
    assert (cache.evictable_size, cache.protected_size) == (0, 5)
    cache.inc_lock_ref(b)  # a second lock on the same path moves no size
    assert (a.lock_ref, b.lock_ref) == (3, 2) and cache.protected_size == 5
    cache.dec_lock_ref(b)
    cache.dec_lock_ref(b)
    assert (a.lock_ref, b.lock_ref, c.lock_ref) == (1, 0, 1)
    assert (cache.evictable_size, cache.protected_size) == (2, 3)
    cache.dec_lock_ref(c)
    assert (a.lock_ref, b.lock_ref, c.lock_ref) == (0, 0, 0)
    assert (cache.evictable_size, cache.protected_size) == (5, 0)
    root_lock = cache.root.lock_ref
    cache.inc_lock_ref(cache.root)  # locking the root is a no-op
    cache.dec_lock_ref(cache.root)
    assert cache.root.lock_ref == root_lock and cache.evictable_size == 5
    # a split of a locked node copies the lock to the new upper node
    cache.inc_lock_ref(b)
    _, upper = cache.match_prefix([1])
    assert upper.key == [1] and upper.lock_ref == 1 and a.lock_ref == 1
    assert (cache.evictable_size, cache.protected_size) == (1, 4)
    check_memory_invariants_tree_only(cache)
    cache.dec_lock_ref(b)
    with pytest.raises(AssertionError, match="underflow"):
        cache.dec_lock_ref(b)


def test_evict_frees_lru_leaves_first():
    cache, rec = make_cache()
    cache.insert([1], T(10))
    cache.insert([2], T(20))
    cache.insert([3], T(30))
    cache.match_prefix([1])  # touch [1]: LRU order is now [2], [3], [1]
    assert cache.evict(1) == 1
    assert rec.batches == [[20]]
    assert cache.evict(2) == 2
    assert rec.batches == [[20], [30], [10]]
    assert cache.total_size() == 0 and cache.root.children == {}
    assert cache.evicted_tokens == 3
    assert cache.evict(5) == 0  # nothing left
    assert cache.evict(0) == 0


def test_evict_frees_whole_leaves_at_least_n():
    cache, rec = make_cache()
    cache.insert([5, 6, 7], T(50, 51, 52))
    cache.insert([8], T(80))
    assert cache.evict(1) == 3  # the older leaf, whole
    assert rec.batches == [[50, 51, 52]]
    assert cache.evict(-1) == 0 and cache.evictable_size == 1


def test_evict_never_frees_locked_nodes():
    cache, rec = make_cache()
    cache.insert([1, 2], T(10, 11))
    cache.insert([3], T(30))
    _, node = cache.match_prefix([1, 2])
    cache.inc_lock_ref(node)
    assert cache.evict(100) == 1
    assert rec.batches == [[30]]
    assert (cache.evictable_size, cache.protected_size) == (0, 2)
    assert cache.evict(100) == 0  # only locked tokens left
    cache.dec_lock_ref(node)
    assert cache.evict(100) == 2
    assert rec.flat() == [30, 10, 11]

    # locked inner node with an unlocked child: only the child can go, no cascade
    cache2, rec2 = make_cache()
    cache2.insert([1, 2, 3], T(10, 11, 12))
    _, upper = cache2.match_prefix([1])
    cache2.inc_lock_ref(upper)
    assert cache2.evict(100) == 2
    assert rec2.batches == [[11, 12]]
    assert cache2.root.children[1] is upper and upper.children == {}
    assert (cache2.evictable_size, cache2.protected_size) == (0, 1)


def test_evict_cascades_to_parents_that_become_leaves():
    cache, rec = make_cache()
    cache.insert([1, 2, 3], T(10, 11, 12))
    cache.insert([1, 2, 4], T(10, 11, 14))  # A=[1,2] -> B=[3], C=[4]; B older than C
    assert cache.evict(2) == 2
    assert rec.batches == [[12], [14]]  # A became a leaf but 2 tokens were enough
    assert shape(cache) == {1: ([1, 2], [10, 11], {})}
    assert cache.evict(1) == 2
    assert rec.batches == [[12], [14], [10, 11]]

    # a parent that becomes a leaf is ordered by its own last access among the other leaves
    cache, rec = make_cache()
    cache.insert([1, 2, 3], T(10, 11, 12))
    cache.match_prefix([1])  # split: upper [1] is fresher than lower [2, 3]
    cache.insert([9], T(90))  # freshest
    assert cache.evict(3) == 3
    assert rec.batches == [[11, 12], [10]]
    assert shape(cache) == {9: ([9], [90], {})}
    # ... and a parent fresher than another leaf waits for it
    cache, rec = make_cache()
    cache.insert([9], T(90))
    cache.insert([1, 2, 3], T(10, 11, 12))
    cache.match_prefix([1])
    assert cache.evict(4) == 4
    assert rec.batches == [[90], [11, 12], [10]]


def test_flush_refused_while_locked():
    cache, rec = make_cache()
    cache.insert([1, 2], T(10, 11))
    cache.insert([3], T(30))
    _, node = cache.match_prefix([1, 2])
    cache.inc_lock_ref(node)
    assert cache.flush() is False
    assert rec.batches == [] and cache.total_size() == 3
    cache.dec_lock_ref(node)
    assert cache.flush() is True
    assert sorted(rec.flat()) == [10, 11, 30]
    assert cache.total_size() == 0 and cache.root.children == {} and cache.all_nodes() == []
    assert cache.match_prefix([1, 2])[0].size == 0
    assert cache.flush() is True  # empty cache flushes fine
    assert cache.insert([1], T(5)) == 0  # still usable


def test_stats():
    cache, _ = make_cache()
    s = cache.stats()
    assert s["hit_rate"] == 0 and s["query_tokens"] == 0 and s["cache_size"] == 0
    cache.insert([1, 2, 3], T(10, 11, 12))
    cache.insert([4], T(40))
    cache.record_hit(3, 10)
    cache.record_hit(0, 5)
    _, node = cache.match_prefix([4])
    cache.inc_lock_ref(node)
    s = cache.stats()
    assert (s["hit_tokens"], s["query_tokens"]) == (3, 15)
    assert s["hit_rate"] == pytest.approx(0.2)
    assert (s["cache_size"], s["evictable_size"], s["protected_size"]) == (4, 3, 1)
    cache.evict(1)
    s = cache.stats()
    assert s["evicted_tokens"] == 3 and s["cache_size"] == 1
