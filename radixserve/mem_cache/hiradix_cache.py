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

Eviction lives in ``tier_eviction.py``.  The moves go to the worker in one ``KVTierReq`` per
call, in order, before the call returns, so slots freed here are never reused before their KV
was copied.  Scheduler thread only.
"""
from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from typing import Optional, Protocol

import numpy as np

from radixserve.ipc.tier_link import KVTierReply, KVTierReq, TierMove
from radixserve.mem_cache.allocator import SlotAllocator
from radixserve.mem_cache.radix_cache import RadixCache
from radixserve.mem_cache.tier_eviction import TierEviction, _np
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


def _common_len(edge: list[int], key: list[int], pos: int) -> int:
    n, limit = 0, min(len(edge), len(key) - pos)
    while n < limit and edge[n] == key[pos + n]:
        n += 1
    return n


class HiRadixCache(TierEviction, RadixCache):
    """The ``PrefixCache`` contract over three tiers (see the module docstring); eviction and
    deletion are ``TierEviction``'s."""

    kind = "hierarchical"
    tiered = True

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
    def match_prefix(self, key: list[int], salt: Optional[str] = None) -> tuple[np.ndarray, TreeNode]:
        """The pool part of the longest match (lower-tier nodes are left to ``fetch``)."""
        path = self._walk(key, salt, split_lower=False)
        pool = [n for n in path if n.value is not None]
        value = np.concatenate([n.value for n in pool]) if pool else np.empty(0, dtype=np.int64)
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

    def cached_len(self, key: list[int], salt: Optional[str] = None) -> int:
        return sum(len(n.key) for n in self._walk(key, salt, split_lower=False))

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
            node.value = slots[at: at + len(node.key)].copy()
            at += len(node.key)
            self.evictable_size += len(node.key)
            self.tiers.count_load("host" if loads[i].kind == "host_to_pool" else "disk", len(node.key))
        if at < total:
            self.free_fn(slots[at:].copy())
        if bad < len(lower):
            logger.warning("hierarchical cache: block %s of %d tokens did not load; recomputing them",
                           lower[bad].disk[0] if lower[bad].disk else "?", len(lower[bad].key))
            self.tiers.failed_loads += 1
            self._delete_subtree(lower[bad])
        return at

    # ---------------------------------------------------------------- insert
    def insert(self, key: list[int], value: np.ndarray, salt: Optional[str] = None) -> int:
        node, pos, first_lower, fresh = self.root, 0, None, []
        stamp = next(clock)
        while pos < len(key):
            child = node.children.get(child_key(salt, key[pos]))
            if child is None:
                new = TreeNode(list(key[pos:]), np.array(value[pos:], dtype=np.int64), node, salt)
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
                child.value = np.array(value[pos: pos + n], dtype=np.int64)
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

    def stats(self) -> dict[str, float]:
        s = super().stats()
        s.update(self.tiers.stats())
        return s
