"""The interface of a prefix cache: ``RadixCache`` shares prefixes, ``NoPrefixCache`` does not.

``KVManager`` is built with one of them and never asks which; the memory invariants
(``invariants.py``) hold for both.  Slots the cache owns belong to tree nodes; a request
locks the path of its cached prefix through the node where that prefix ends (the root
when nothing is cached).  Single-threaded: the scheduler thread only.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable, NamedTuple, Optional

import numpy as np

from radixserve.mem_cache.cache_stats import CacheStats
from radixserve.mem_cache.tree_node import TreeNode


class Cached(NamedTuple):
    """What ``cache_unfinished`` did: the request's prefix now ends at ``node`` (locked);
    ``slots`` are the slots of the whole key when the request's own slots were replaced by
    the tree's (its row must be rewritten), else None."""

    node: TreeNode
    slots: Optional[np.ndarray]


class PrefixCache(ABC):
    """Contract shared by every prefix cache (see ``RadixCache`` for the sharing one):

    * ``match_prefix(key)`` returns the slots of the longest cached prefix of ``key`` and the
      node where it ends (the root when nothing matches).
    * ``inc_lock_ref/dec_lock_ref(node)`` lock or unlock the path from ``node`` to the root;
      locked nodes are never evicted.
    * ``cache_unfinished(key, slots, cached_len, node)``: the request computed ``key`` into
      ``slots`` (``slots[:cached_len]`` are the cache's own, locked through ``node``).  The
      cache may take the computed tokens over, freeing the request's duplicates of tokens it
      already held, and move the lock to where ``key`` ends; returns a ``Cached`` then, or None
      when it kept nothing (the request still holds ``slots[cached_len:]`` and the lock).
    * ``cache_finished(key, slots, cached_len, node)``: the request gives up its KV: the cache
      keeps what it wants, frees the rest through ``free_fn`` and unlocks ``node``.
    * ``evict(n)`` frees at least ``n`` unlocked tokens (when possible) and returns how many.
    * ``flush()`` drops every cached token; refused (False) while any node is locked.
    Every method that takes a key also takes ``salt`` (None: the shared namespace): keys
    under different salts never match each other's tokens (cache isolation between tenants).
    Accounting: ``evictable_size``/``protected_size`` (unlocked/locked cached tokens),
    ``num_nodes``, ``record_hit`` (admissions; also each matched node's ``hit_count``),
    ``evicted_tokens``; ``stats()`` reports them, and ``counters`` (``CacheStats``) keeps
    them over time windows for the inspector.  ``kind``: "radix" or "none".
    """

    kind = "radix"
    tiered = False  # lower tiers below the pool (``fetch``/``prefetch`` do something): HiRadixCache

    def __init__(self, free_fn: Callable[[np.ndarray], None]) -> None:
        self.free_fn = free_fn
        # called with (the tree's slots, the request's duplicate slots of the same tokens) just
        # before the duplicates are freed (the sliding pool moves their sliding KV to the tree)
        self.on_duplicates: Optional[Callable[[np.ndarray, np.ndarray], None]] = None
        self.reset()

    def reset(self) -> None:
        self.root = TreeNode([], np.empty(0, dtype=np.int64), None)
        self.root.lock_ref = 1
        self.evictable_size = 0
        self.protected_size = 0
        self.hit_tokens = 0
        self.query_tokens = 0
        self.evicted_tokens = 0
        self.num_nodes = 0  # every node but the root
        self.counters = CacheStats()

    def total_size(self) -> int:
        return self.evictable_size + self.protected_size

    def record_hit(self, matched: int, total: int, node: Optional[TreeNode] = None) -> None:
        """A first admission matched ``matched`` of its ``total`` prompt tokens, ending at
        ``node``: counts the hit on every node of that path (not the root)."""
        self.hit_tokens += matched
        self.query_tokens += total
        self.counters.record_hit(matched, total)
        while node is not None and node is not self.root:
            node.hit_count += 1
            node = node.parent

    def stats(self) -> dict[str, float]:
        return {
            "cache_size": self.total_size(),
            "evictable_size": self.evictable_size,
            "protected_size": self.protected_size,
            "hit_tokens": self.hit_tokens,
            "query_tokens": self.query_tokens,
            "hit_rate": self.hit_tokens / max(1, self.query_tokens),
            "evicted_tokens": self.evicted_tokens,
        }

    @abstractmethod
    def match_prefix(self, key: list[int], salt: Optional[str] = None) -> tuple[np.ndarray, TreeNode]: ...

    def cached_len(self, key: list[int], salt: Optional[str] = None) -> int:
        """How many leading tokens of ``key`` are cached, in any tier (stamps their LRU time)."""
        return len(self.match_prefix(key, salt)[0])

    def fetch(self, key: list[int], salt: Optional[str] = None) -> int:
        """Bring the part of ``key``'s match that a lower tier holds into the pool (only the
        hierarchical cache has one); returns the tokens loaded."""
        return 0

    def prefetch(self, key: list[int], salt: Optional[str] = None) -> None:
        """Start reading what a lower tier holds of ``key``'s match ahead of ``fetch`` (only the
        hierarchical cache has one); changes nothing in the tree."""

    @abstractmethod
    def insert(self, key: list[int], value: np.ndarray, salt: Optional[str] = None) -> int:
        """Store ``value[i]`` as the slot of ``key[i]``; returns how many leading tokens were
        cached already (the caller frees its own duplicates ``value[cached_before:returned]``).
        ``NoPrefixCache`` stores nothing, returns 0 and leaves ``value`` with the caller."""

    @abstractmethod
    def inc_lock_ref(self, node: TreeNode) -> None: ...

    @abstractmethod
    def dec_lock_ref(self, node: TreeNode) -> None: ...

    @abstractmethod
    def cache_unfinished(self, key: list[int], slots: np.ndarray, cached_len: int,
                         node: TreeNode, salt: Optional[str] = None) -> Optional[Cached]: ...

    @abstractmethod
    def cache_finished(self, key: list[int], slots: np.ndarray, cached_len: int, node: TreeNode,
                       salt: Optional[str] = None) -> None: ...

    @abstractmethod
    def evict(self, num_tokens: int) -> int: ...

    def flush(self) -> bool:
        """Drop every cached token; refused (False) while any node is locked.  The root
        (which running requests with nothing cached point at) and the stats survive."""
        if self.protected_size:
            return False
        self.evict(self.evictable_size)
        return True

    @abstractmethod
    def all_nodes(self) -> list[TreeNode]:
        """Every node but the root (for invariant checks)."""
