"""Checks of the memory invariants in docs/ARCHITECTURE.md; used by the tests after every scenario."""
from __future__ import annotations

from typing import Iterable

import torch

from radixserve.mem_cache.allocator import SlotAllocator
from radixserve.mem_cache.prefix_cache import PrefixCache
from radixserve.mem_cache.swa_slots import SwaSlotAllocator


def check_memory_invariants(allocator: SlotAllocator, cache: PrefixCache,
                            held: Iterable[tuple[torch.Tensor, object]] = ()) -> None:
    """Every slot in 1..num_slots-1 is exactly one of: free, owned by one cache node, held
    by one running request (for either ``PrefixCache``).  ``held`` yields (slots held by a request, its locked node).
    Also checks the tree's structure and its size/lock accounting."""
    owners: dict[int, str] = {}

    def claim(slots: torch.Tensor, who: str) -> None:
        for s in slots.tolist():
            assert 0 < s < allocator.num_slots, f"slot {s} out of range ({who})"
            assert s not in owners, f"slot {s} owned twice: {owners[s]} and {who}"
            owners[s] = who

    claim(allocator.free_slots(), "free")
    evictable = protected = 0
    lock_count: dict[int, int] = {}
    for node in cache.all_nodes():
        assert len(node.key) == len(node.value) > 0, "empty or ragged radix node"
        assert node.parent.children.get(node.index_key) is node, "child indexed under the wrong token"
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


def _check_sliding(allocator: SwaSlotAllocator, free_full: set[int]) -> None:
    """Every sliding slot is free or the sliding slot of exactly one full slot that is in use."""
    mapped = torch.nonzero(allocator.swa_of).squeeze(1).tolist()
    assert not free_full.intersection(mapped), "a free slot keeps a sliding slot"
    used = allocator.swa_of[allocator.swa_of > 0].tolist()
    assert len(set(used)) == len(used), "a sliding slot given to two tokens"
    free = allocator.sliding.free_slots().tolist()
    assert not set(free).intersection(used), "a sliding slot both free and in use"
    assert sorted(free + used) == list(range(1, allocator.num_swa_slots)), "sliding slots leaked (in no state)"
