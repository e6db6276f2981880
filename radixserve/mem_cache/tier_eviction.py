"""How the hierarchical cache evicts: the pool's leaves to the host tier, the host tier's to disk,
the disk tier's out of the tree (``HiRadixCache``'s half that frees memory; a mixin: the tree
and its ``TierState`` are the cache's).  Scheduler thread only.

Every move is appended to ``_moves`` in the order it was decided and the queue goes to the worker
in one request before ``evict`` returns: a node demoted to the host tier and then, in the same
call, pushed on to disk is copied to the host tier before its block is written.
"""
from __future__ import annotations

import heapq
from typing import Any, Callable

import numpy as np

from radixserve.ipc.tier_link import TierMove
from radixserve.mem_cache.cache_stats import CacheStats
from radixserve.mem_cache.tier_state import TierState
from radixserve.mem_cache.tree_node import TreeNode


def _np(t: np.ndarray) -> np.ndarray:
    return np.array(t, dtype=np.int64)  # a copy: the message must not change with the tree


class TierEviction:
    root: TreeNode
    tiers: TierState
    _moves: list[TierMove]
    _block_ids: Any
    free_fn: Callable[[np.ndarray], None]
    evictable_size: int
    evicted_tokens: int
    num_nodes: int
    counters: CacheStats
    all_nodes: Callable[[], list[TreeNode]]  # RadixCache's

    def evict(self, num_tokens: int) -> int:
        """Demote unlocked pool leaves (LRU) to the host tier until ``num_tokens`` pool slots
        are free; a node the host tier cannot take is dropped with its subtree."""
        if num_tokens <= 0 or self.evictable_size == 0:
            return 0
        heap = [(n.last_access, id(n), n) for n in self.all_nodes() if self._pool_leaf(n)]
        heapq.heapify(heap)
        freed, nodes, released = 0, 0, []
        while freed < num_tokens and heap:
            _, _, node = heapq.heappop(heap)
            if node.host is None:
                host = self.tiers.host_alloc(len(node.key), self._evict_host)
                if host is not None:
                    node.host = host
                    self.tiers.host_tokens += len(node.key)
                    # in order with the host tier's own evictions: a later one may write this node to disk
                    self._moves.append(TierMove("pool_to_host", _np(node.value), _np(host)))
            released.append(node.value)
            freed += len(node.key)
            nodes += 1
            self.evictable_size -= len(node.key)
            node.value = None
            parent = node.parent
            if node.host is None and node.disk is None:
                self._delete_subtree(node)
            if self._pool_leaf(parent):
                heapq.heappush(heap, (parent.last_access, id(parent), parent))
        self._send([])
        for slots in released:
            self.free_fn(slots)
        self.evicted_tokens += freed
        self.counters.record_eviction(nodes, freed)
        return freed

    def _pool_leaf(self, node: TreeNode) -> bool:
        return (node is not self.root and node.value is not None and node.lock_ref == 0
                and all(c.value is None for c in node.children.values()))

    def _evict_host(self, num_tokens: int) -> None:
        """Free ``num_tokens`` host slots: host leaves in LRU order go to disk (or away)."""
        pinned = self.tiers.pinned
        heap = [(n.last_access, id(n), n) for n in self.all_nodes()
                if n.host is not None and id(n) not in pinned and all(c.host is None for c in n.children.values())]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, node = heapq.heappop(heap)
            if node.value is None and node.disk is None and self.tiers.disk_budget:
                self._to_disk(node)
            self.tiers.host.free(node.host)
            self.tiers.host_tokens -= len(node.key)
            freed += len(node.key)
            node.host = None
            parent = node.parent
            if node.value is None and node.disk is None:
                self._delete_subtree(node)
            if (parent is not self.root and parent.host is not None and id(parent) not in pinned
                    and all(c.host is None for c in parent.children.values())):
                heapq.heappush(heap, (parent.last_access, id(parent), parent))

    def _to_disk(self, node: TreeNode) -> None:
        nbytes = self.tiers.block_bytes(len(node.key))
        if not self.tiers.disk_room(nbytes, self._evict_disk):
            return
        block = f"b{next(self._block_ids)}"
        self.tiers.add_block(block, nbytes, node)
        node.disk = (block, 0)
        self._moves.append(TierMove("host_to_disk", src=_np(node.host), block=block,
                                    tokens=np.asarray(node.key, dtype=np.int64), salt=node.salt))

    def _evict_disk(self, nbytes: int) -> None:
        """Delete disk-only leaves in LRU order until ``nbytes`` of blocks are released."""
        pinned = self.tiers.pinned
        heap = [(n.last_access, id(n), n) for n in self.all_nodes()
                if n.disk is not None and n.value is None and n.host is None and not n.children
                and id(n) not in pinned]
        heapq.heapify(heap)
        target = self.tiers.disk_used - nbytes
        while self.tiers.disk_used > max(0, target) and heap:
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            self._delete_subtree(node)
            if (parent is not self.root and parent.disk is not None and parent.value is None
                    and parent.host is None and not parent.children and id(parent) not in pinned):
                heapq.heappush(heap, (parent.last_access, id(parent), parent))

    def _delete_subtree(self, top: TreeNode) -> None:
        """Remove ``top`` (not in the pool) and everything under it from the tree and the tiers."""
        stack, gone = [top], 0
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            assert node.value is None and node.lock_ref == 0, "deleting a node that is in the pool"
            if node.host is not None:
                self.tiers.host.free(node.host)
                self.tiers.host_tokens -= len(node.key)
                node.host = None
            if node.disk is not None:
                self._release_block(node)
            gone += 1
        del top.parent.children[top.index_key]
        self.num_nodes -= gone

    def _release_block(self, node: TreeNode) -> None:
        block = node.disk[0]
        node.disk = None
        if self.tiers.unref_block(block, node):
            self._moves.append(TierMove("drop_block", block=block))

    def _lose_block(self, block: str) -> None:
        """A block's write failed: nodes that relied on it alone go (recomputed when needed)."""
        for node in list(self.tiers.block_nodes.get(block, ())):
            node.disk = None
            self.tiers.unref_block(block, node)
            if node.value is None and node.host is None and node.parent is not None \
                    and node.parent.children.get(node.index_key) is node:
                self._delete_subtree(node)
        self.tiers.lost_blocks += 1

    @staticmethod
    def _below(node: TreeNode) -> list[TreeNode]:
        out, stack = [], list(node.children.values())
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(n.children.values())
        return out
