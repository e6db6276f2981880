"""NoPrefixCache, the PrefixCache behind ``disable_radix_cache``: it matches nothing, keeps
nothing, locks only the root, and frees a finished request's slots itself."""
from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.kv_helpers import T, make_cache
from radixserve.mem_cache.no_prefix_cache import NoPrefixCache
from radixserve.mem_cache.tree_node import TreeNode


def test_no_prefix_cache_contract():
    freed: list[list[int]] = []
    cache = NoPrefixCache(lambda s: freed.append(s.tolist()))
    slots, node = cache.match_prefix([1, 2, 3])
    assert slots.size == 0 and node is cache.root
    cache.inc_lock_ref(node)
    cache.dec_lock_ref(node)
    with pytest.raises(AssertionError):
        cache.inc_lock_ref(TreeNode([1], np.array([5]), cache.root))
    value = np.array([4, 5, 6])
    assert cache.insert([1, 2, 3], value) == 0 and freed == []  # nothing kept, nothing taken
    assert cache.cache_unfinished([1, 2, 3], value, 0, cache.root) is None and freed == []
    cache.cache_finished([1, 2, 3], value, 0, cache.root)
    assert freed == [[4, 5, 6]]
    assert cache.evict(10) == 0 and cache.flush() is True and cache.all_nodes() == []
    cache.record_hit(0, 7)
    s = cache.stats()
    assert (s["cache_size"], s["hit_tokens"], s["query_tokens"], s["hit_rate"]) == (0, 0, 7, 0.0)


def test_disable_makes_cache_inert():
    cache, rec = make_cache(disable=True)
    assert cache.insert([1, 2, 3], T(10, 11, 12)) == 0
    assert cache.insert([1, 2, 3], T(10, 11, 12)) == 0
    slots, node = cache.match_prefix([1, 2, 3])
    assert slots.size == 0 and node is cache.root
    assert cache.total_size() == 0 and cache.all_nodes() == []
    assert cache.evict(10) == 0 and rec.batches == []
    assert cache.flush() is True
