"""Checks of the memory invariants in docs/ARCHITECTURE.md; used by the tests after every scenario."""
from __future__ import annotations

from typing import Iterable

import numpy as np

from radixserve.mem_cache.allocator import SlotAllocator
from radixserve.mem_cache.hiradix_cache import HiRadixCache
from radixserve.mem_cache.prefix_cache import PrefixCache
from radixserve.mem_cache.swa_slots import SwaSlotAllocator


def check_memory_invariants(allocator: SlotAllocator, cache: PrefixCache,
                            held: Iterable[tuple[np.ndarray, object]] = ()) -> None:
    """Every slot in 1..num_slots-1 is exactly one of: free, owned by one cache node, held
    by one running request (for either ``PrefixCache``).  ``held`` yields (slots held by a request, its locked node).
    Also checks the tree's structure and its size/lock accounting."""
    owners: dict[int, str] = {}

    def claim(slots: np.ndarray, who: str) -> None:
        for s in slots.tolist():
            assert 0 < s < allocator.num_slots, f"slot {s} out of range ({who})"
            assert s not in owners, f"slot {s} owned twice: {owners[s]} and {who}"
            owners[s] = who

    claim(allocator.free_slots(), "free")
    evictable = protected = 0
    lock_count: dict[int, int] = {}
    for node in cache.all_nodes():
        assert node.parent.children.get(node.index_key) is node, "child indexed under the wrong token"
        if node.value is None:  # only in a lower tier of the hierarchical cache (checked below)
            assert node.lock_ref == 0 and node.key, "a locked or empty node outside the pool"
            continue
        assert len(node.key) == len(node.value) > 0, "empty or ragged radix node"
        assert node.parent is cache.root or node.parent.value is not None, "a pool node under a node outside it"
        claim(node.value, f"node {id(node)}")
        if node.lock_ref > 0:
            protected += len(node.key)
        else:
            evictable += len(node.key)
        assert all(node.lock_ref >= c.lock_ref for c in node.children.values()), "child locked more than parent"
        assert all(c.salt == node.salt for c in node.children.values()), "a node's children in another namespace"
    assert (evictable, protected) == (cache.evictable_size, cache.protected_size), "tree size accounting"
    assert len(cache.all_nodes()) == cache.num_nodes, "tree node count accounting"
    for i, (slots, node) in enumerate(held):
        claim(slots, f"request {i}")
        while node is not None and node is not cache.root:
            lock_count[id(node)] = lock_count.get(id(node), 0) + 1
            node = node.parent
    for node in cache.all_nodes():
        assert node.lock_ref == lock_count.get(id(node), 0), "lock_ref does not match the running requests"
    missing = allocator.num_slots - 1 - len(owners)
    assert missing == 0, f"{missing} slots leaked (in no state)"
    if isinstance(allocator, SwaSlotAllocator):
        _check_sliding(allocator, {s for s, who in owners.items() if who == "free"})
    if isinstance(cache, HiRadixCache):
        _check_tiers(cache)


def _check_tiers(cache: HiRadixCache) -> None:
    """Every host slot is free or held by exactly one node; every node is in some tier; the
    block table matches the nodes' block references and the disk accounting."""
    t = cache.tiers
    owners: dict[int, int] = {s: 0 for s in t.host.free_slots().tolist()}
    assert len(owners) == t.host.available_size(), "a host slot free twice"
    refs: dict[str, set[int]] = {}
    host_tokens = 0
    for node in cache.all_nodes():
        assert node.value is not None or node.host is not None or node.disk is not None, "a node in no tier"
        if node.host is not None:
            assert len(node.host) == len(node.key), "ragged host slots"
            host_tokens += len(node.key)
            for s in node.host.tolist():
                assert 0 < s < t.host.num_slots and s not in owners, f"host slot {s} owned twice or out of range"
                owners[s] = id(node)
        if node.disk is not None:
            refs.setdefault(node.disk[0], set()).add(id(node))
    assert len(owners) == t.host.num_slots - 1, f"{t.host.num_slots - 1 - len(owners)} host slots leaked"
    assert host_tokens == t.host_tokens, "host tier accounting"
    assert refs == {b: set(map(id, nodes)) for b, nodes in t.block_nodes.items()}, "block table and nodes differ"
    assert t.disk_used == sum(t.blocks.values()) and t.disk_used <= t.disk_budget, "disk accounting"


def _check_sliding(allocator: SwaSlotAllocator, free_full: set[int]) -> None:
    """Every sliding slot is free or the sliding slot of exactly one full slot that is in use."""
    mapped = np.flatnonzero(allocator.swa_of).tolist()
    assert not free_full.intersection(mapped), "a free slot keeps a sliding slot"
    used = allocator.swa_of[allocator.swa_of > 0].tolist()
    assert len(set(used)) == len(used), "a sliding slot given to two tokens"
    free = allocator.sliding.free_slots().tolist()
    assert not set(free).intersection(used), "a sliding slot both free and in use"
    assert sorted(free + used) == list(range(1, allocator.num_swa_slots)), "sliding slots leaked (in no state)"
