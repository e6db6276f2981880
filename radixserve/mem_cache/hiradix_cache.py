"""The hierarchical radix cache: the pool, a host-memory tier under it and a disk tier under that.

SGLang's HiCache semantics on this runtime's tree (``docs/HIERARCHICAL_CACHE.md``):

* A node's KV lives in one or more tiers (``TreeNode.value`` / ``host`` / ``disk``); a node in
  the pool has its parent in the pool (or is a child of the root), so the pool holds whole
  prefixes and a lock still covers a path of pool nodes.
* Eviction from the pool demotes: the node keeps its host copy (made when it was cached, with
  ``write_through``) or gets one now (``write_back``); only when the host tier cannot take it
  does the node go.  Eviction from the host tier writes the node to disk (when the disk tier
  is on and the node is not there yet); eviction from disk, in LRU order within its byte
  budget, deletes the node.  A node that loses its last tier takes its subtree with it.
* ``fetch(key)``, at admission, loads the lower-tier part of the longest match back into the
  pool (host -> pool, disk -> pool) so that ``match_prefix`` then returns it.  A block that
  fails to load (missing, truncated, corrupt) drops that node and its subtree: the request
  recomputes those tokens, nothing wrong is served.
* Inserting tokens a lower-tier node holds makes the node take the request's fresh pool slots.

The moves go to the worker in one ``KVTierReq`` per call, in order, before the call returns, so
slots freed here are never reused before their KV was copied.  Scheduler thread only.
"""
from __future__ import annotations

import heapq
import itertools
import logging
from dataclasses import dataclass
from typing import Optional, Protocol

import numpy as np
import torch

from radixserve.ipc.tier_link import KVTierReply, KVTierReq, TierMove
from radixserve.mem_cache.allocator import SlotAllocator
from radixserve.mem_cache.radix_cache import RadixCache
from radixserve.mem_cache.tier_state import TierState
from radixserve.mem_cache.tree_node import TreeNode, child_key, clock

logger = logging.getLogger(__name__)


class TierLink(Protocol):
    """The worker's end: ``RemoteWorker`` over ZeroMQ, or a ``TierStore`` in-process."""

    def apply_tiers(self, req: KVTierReq) -> KVTierReply: ...


@dataclass(frozen=True)
class TierSpec:
    """What ``KVManager`` needs to build a ``HiRadixCache`` (sizes from ``CacheConfig`` and the worker)."""

    link: TierLink
    host_slots: int
    disk_bytes: int = 0
    bytes_per_token: int = 0
    write_through: bool = True


def _np(t: torch.Tensor) -> np.ndarray:
    return t.numpy().astype(np.int64, copy=True)


def _common_len(edge: list[int], key: list[int], pos: int) -> int:
    n, limit = 0, min(len(edge), len(key) - pos)
    while n < limit and edge[n] == key[pos + n]:
        n += 1
    return n


class HiRadixCache(RadixCache):
    kind = "hierarchical"

    def __init__(self, pool: SlotAllocator, link: TierLink, host_slots: int, disk_bytes: int,
                 block_bytes_per_token: int, write_through: bool = True) -> None:
        """``pool``: the KV pool's allocator (freed slots go back to it, loads take from it);
        ``host_slots``: token slots of the host tier; ``disk_bytes``: the disk tier's budget (0:
        no disk tier); ``block_bytes_per_token``: what a token costs in a block file."""
        self.pool, self.link, self.write_through = pool, link, write_through
        self.tiers = TierState(SlotAllocator(host_slots), disk_bytes, block_bytes_per_token)
        self._moves: list[TierMove] = []
        self._block_ids = itertools.count()
        super().__init__(pool.free)

    def reset(self) -> None:
        super().reset()
        if hasattr(self, "tiers"):
            self.tiers.reset()

    # ---------------------------------------------------------------- lookup
    def match_prefix(self, key: list[int], salt: Optional[str] = None) -> tuple[torch.Tensor, TreeNode]:
        """The pool part of the longest match (lower-tier nodes are left to ``fetch``)."""
        path = self._walk(key, salt, split_lower=False)
        pool = [n for n in path if n.value is not None]
        value = torch.cat([n.value for n in pool]) if pool else torch.empty(0, dtype=torch.int64)
        return value, pool[-1] if pool else self.root

    def _walk(self, key: list[int], salt: Optional[str], split_lower: bool = True) -> list[TreeNode]:
        """The matched path (stamped), split where the match ends inside a node (a lower-tier
        node only with ``split_lower``)."""
        node, pos, path = self.root, 0, []
        stamp = next(clock)
        while pos < len(key):
            child = node.children.get(child_key(salt, key[pos]))
            if child is None:
                break
            n = _common_len(child.key, key, pos)
            if n < len(child.key):
                if child.value is None and not split_lower:
                    break
                child = self._split(child, n)
            child.last_access = stamp
            path.append(child)
            pos += n
            node = child
        return path

    def prefetch(self, key: list[int], salt: Optional[str] = None) -> None:
        """Ask the worker to read ahead the blocks of ``key``'s match that only the disk tier
        holds (read-only walk: no split, no LRU stamp)."""
        node, pos, blocks = self.root, 0, []
        while pos < len(key):
            child = node.children.get(child_key(salt, key[pos]))
            if child is None:
                break
            n = _common_len(child.key, key, pos)
            if child.value is None and child.host is None and child.disk is not None:
                blocks.append(child.disk[0])
            if n < len(child.key):
                break
            pos, node = pos + n, child
        if blocks:
            self._send([TierMove("prefetch_block", block=b) for b in dict.fromkeys(blocks)])

    def fetch(self, key: list[int], salt: Optional[str] = None) -> int:
        """Load the lower-tier part of ``key``'s longest match into the pool; returns the tokens
        loaded (0 when nothing is below the pool or the pool cannot make room)."""
        path = self._walk(key, salt)
        lower = [n for n in path if n.value is None]
        if not lower:
            return 0
        anchor = lower[0].parent
        total = sum(len(n.key) for n in lower)
        self.inc_lock_ref(anchor)
        self.tiers.pinned = set(map(id, lower))
        try:
            short = total - self.pool.available_size()
            if short > 0:
                self.evict(short)
            slots = self.pool.alloc(total)
        finally:
            self.tiers.pinned = set()
            self.dec_lock_ref(anchor)
        if slots is None:
            return 0
        at, loads = 0, []
        for node in lower:
            dst = slots[at: at + len(node.key)]
            at += len(node.key)
            if node.host is not None:
                loads.append(TierMove("host_to_pool", _np(node.host), _np(dst)))
            else:
                block, offset = node.disk
                loads.append(TierMove("disk_to_pool", dst=_np(dst), block=block, offset=offset))
        base = len(self._moves)
        failed = self._send(loads)
        bad = min((i - base for i in failed if i >= base), default=len(lower))
        at = 0
        for i, node in enumerate(lower[:bad]):
            node.value = slots[at: at + len(node.key)].clone()
            at += len(node.key)
            self.evictable_size += len(node.key)
            self.tiers.count_load("host" if loads[i].kind == "host_to_pool" else "disk", len(node.key))
        if at < total:
            self.free_fn(slots[at:].clone())
        if bad < len(lower):
            logger.warning("hierarchical cache: block %s of %d tokens did not load; recomputing them",
                           lower[bad].disk[0] if lower[bad].disk else "?", len(lower[bad].key))
            self.tiers.failed_loads += 1
            self._delete_subtree(lower[bad])
        return at

    # ---------------------------------------------------------------- insert
    def insert(self, key: list[int], value: torch.Tensor, salt: Optional[str] = None) -> int:
        node, pos, first_lower, fresh = self.root, 0, None, []
        stamp = next(clock)
        while pos < len(key):
            child = node.children.get(child_key(salt, key[pos]))
            if child is None:
                new = TreeNode(list(key[pos:]), value[pos:].clone(), node, salt)
                new.last_access = stamp
                node.children[new.index_key] = new
                self.evictable_size += len(new.key)
                self.num_nodes += 1
                fresh.append(new)
                break
            n = _common_len(child.key, key, pos)
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = stamp
            if child.value is None:  # a lower tier holds it: take the request's fresh slots
                first_lower = pos if first_lower is None else first_lower
                child.value = value[pos: pos + n].clone()
                self.evictable_size += n
                fresh.append(child)
            pos += n
            node = child
        if self.write_through:
            self._back_up([n for n in fresh if n.host is None])
        return first_lower if first_lower is not None else pos

    def _back_up(self, nodes: list[TreeNode]) -> None:
        for node in nodes:
            host = self.tiers.host_alloc(len(node.key), self._evict_host)
            if host is None:
                break
            node.host = host
            self.tiers.host_tokens += len(node.key)
            self._moves.append(TierMove("pool_to_host", _np(node.value), _np(host)))
        self._send([])

    # ---------------------------------------------------------------- eviction
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

    def _split_tiers(self, upper: TreeNode, lower: TreeNode, n: int) -> None:
        if lower.host is not None:
            upper.host, lower.host = lower.host[:n], lower.host[n:]
        if lower.disk is not None:
            block, offset = lower.disk
            upper.disk, lower.disk = (block, offset), (block, offset + n)
            self.tiers.ref_block(block, upper)

    # ---------------------------------------------------------------- worker
    def _send(self, moves: list[TierMove]) -> list[int]:
        """Send the queued moves (``self._moves``, in the order they were decided) and ``moves``
        in one request; returns the failed indices."""
        batch, self._moves = self._moves + moves, []
        if not batch:
            return []
        reply = self.link.apply_tiers(KVTierReq(batch))
        for block in reply.lost_blocks:
            self._lose_block(block)
        return reply.failed

    def _lose_block(self, block: str) -> None:
        """A block's write failed: nodes that relied on it alone go (recomputed when needed)."""
        for node in list(self.tiers.block_nodes.get(block, ())):
            node.disk = None
            self.tiers.unref_block(block, node)
            if node.value is None and node.host is None and node.parent is not None \
                    and node.parent.children.get(node.index_key) is node:
                self._delete_subtree(node)
        self.tiers.lost_blocks += 1

    def flush(self) -> bool:
        if self.protected_size:
            return False
        for child in list(self.root.children.values()):
            for node in [child] + self._below(child):
                if node.value is not None:
                    self.free_fn(node.value)
                    node.value = None
            self._delete_subtree(child)
        self.evictable_size = 0
        self._send([])
        return True

    @staticmethod
    def _below(node: TreeNode) -> list[TreeNode]:
        out, stack = [], list(node.children.values())
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(n.children.values())
        return out

    def stats(self) -> dict[str, float]:
        s = super().stats()
        s.update(self.tiers.stats())
        return s
