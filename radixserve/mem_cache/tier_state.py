"""The bookkeeping of the hierarchical cache's lower tiers: host slots, disk blocks, counters.

``HiRadixCache`` owns one ``TierState`` and is its only writer (scheduler thread).  The host
tier is a ``SlotAllocator`` over the worker's host buffers; the disk tier is a byte budget over
block files, each referenced by the tree nodes that hold rows of it (a split node shares its
block), deleted once no node references it.
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from radixserve.mem_cache.allocator import SlotAllocator
from radixserve.mem_cache.tree_node import TreeNode

BLOCK_OVERHEAD = 4096  # header, token ids' padding and checksum of a block file, roughly


class TierState:
    def __init__(self, host: SlotAllocator, disk_budget: int, bytes_per_token: int) -> None:
        self.host, self.disk_budget, self.bytes_per_token = host, disk_budget, bytes_per_token
        self.reset()

    def reset(self) -> None:
        self.host.reset()
        self.host_tokens = 0
        self.disk_used = 0
        self.blocks: dict[str, int] = {}  # block -> bytes
        self.block_nodes: dict[str, set[TreeNode]] = {}
        self.pinned: set[int] = set()  # ids of nodes a load is about to read: never evicted meanwhile
        self.loaded = {"host": 0, "disk": 0}  # tokens loaded back into the pool, by tier
        self.failed_loads = 0
        self.lost_blocks = 0

    # ---------------------------------------------------------------- host
    def host_alloc(self, n: int, evict: Callable[[int], None]) -> Optional[np.ndarray]:
        """``n`` host slots, evicting host entries (``evict(short)``) when short; None when the
        tier cannot hold ``n`` tokens."""
        if n > self.host.num_slots - 1:
            return None
        short = n - self.host.available_size()
        if short > 0:
            evict(short)
        return self.host.alloc(n)

    # ---------------------------------------------------------------- disk
    def block_bytes(self, tokens: int) -> int:
        return tokens * self.bytes_per_token + 8 * tokens + BLOCK_OVERHEAD

    def disk_room(self, nbytes: int, evict: Callable[[int], None]) -> bool:
        """Whether ``nbytes`` fit the budget, evicting (``evict(nbytes)``) to make room."""
        if nbytes > self.disk_budget:
            return False
        if self.disk_used + nbytes > self.disk_budget:
            evict(self.disk_used + nbytes - self.disk_budget)
        return self.disk_used + nbytes <= self.disk_budget

    def add_block(self, block: str, nbytes: int, node: TreeNode) -> None:
        self.blocks[block] = nbytes
        self.block_nodes[block] = {node}
        self.disk_used += nbytes

    def ref_block(self, block: str, node: TreeNode) -> None:
        self.block_nodes[block].add(node)

    def unref_block(self, block: str, node: TreeNode) -> bool:
        """Drop ``node``'s reference; True when the block is now unreferenced (and forgotten)."""
        nodes = self.block_nodes.get(block)
        if nodes is None:
            return False
        nodes.discard(node)
        if nodes:
            return False
        del self.block_nodes[block]
        self.disk_used -= self.blocks.pop(block)
        return True

    def count_load(self, tier: str, tokens: int) -> None:
        self.loaded[tier] += tokens

    def stats(self) -> dict[str, float]:
        return {"host_tokens": self.host_tokens, "host_slots": self.host.num_slots - 1,
                "host_free_slots": self.host.available_size(), "disk_blocks": len(self.blocks),
                "disk_bytes": self.disk_used, "disk_budget_bytes": self.disk_budget,
                "host_hit_tokens": self.loaded["host"], "disk_hit_tokens": self.loaded["disk"],
                "failed_loads": self.failed_loads, "lost_blocks": self.lost_blocks}
