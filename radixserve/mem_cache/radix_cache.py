"""Radix tree from token sequences to the KV slots that hold them (page size 1)."""
from __future__ import annotations

import heapq
import time
from typing import Optional

import numpy as np

from radixserve.mem_cache.prefix_cache import Cached, PrefixCache
from radixserve.mem_cache.tree_node import TreeNode, child_key, clock

_EMPTY = np.empty(0, dtype=np.int64)


def _common_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class RadixCache(PrefixCache):
    """SGLang-style radix cache (the ``PrefixCache`` contract, plus):

      * ``match_prefix(key)`` splits a node so that the match ends on a boundary.
      * ``insert(key, value)`` stores ``value[i]`` as the slot of ``key[i]`` and returns how
        many leading tokens were already cached; the caller must free its own duplicate
        slots ``value[cached_before:returned]``.
      * ``evict(n)`` frees unlocked leaves in LRU order through ``free_fn``.
    Every slot in the tree is owned by exactly one node.  ``salt`` (``tree_node.py``) selects
    a namespace: keys under different salts never share a node, so never share KV.
    """

    # ---------------------------------------------------------------- lookup
    def match_prefix(self, key: list[int], salt: Optional[str] = None) -> tuple[np.ndarray, TreeNode]:
        if not key:
            return _EMPTY, self.root
        node, values, pos = self.root, [], 0
        stamp, now = next(clock), time.monotonic()
        while pos < len(key):
            child = node.children.get(child_key(salt, key[pos]))
            if child is None:
                break
            n = _common_len(child.key, key[pos:pos + len(child.key)])
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access, child.access_time = stamp, now
            values.append(child.value)
            pos += n
            node = child
        value = np.concatenate(values) if len(values) > 1 else (values[0] if values else _EMPTY)
        return value, node

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Cut ``child``'s edge after ``n`` tokens; returns the new upper node."""
        upper = TreeNode(child.key[:n], None if child.value is None else child.value[:n], child.parent, child.salt)
        upper.lock_ref = child.lock_ref
        upper.last_access, upper.access_time = child.last_access, child.access_time
        upper.hit_count = child.hit_count  # every hit through the lower part ran through the upper
        self.num_nodes += 1
        upper.children[child_key(child.salt, child.key[n])] = child
        child.parent.children[child.index_key] = upper
        child.parent = upper
        child.key = child.key[n:]
        if child.value is not None:
            child.value = child.value[n:]
        self._split_tiers(upper, child, n)
        return upper

    def _split_tiers(self, upper: TreeNode, lower: TreeNode, n: int) -> None:
        """Hook: split what a subclass keeps per node besides the pool slots (``lower`` already
        lost its first ``n`` tokens to ``upper``)."""

    # ---------------------------------------------------------------- insert
    def insert(self, key: list[int], value: np.ndarray, salt: Optional[str] = None) -> int:
        node, pos = self.root, 0
        stamp, now = next(clock), time.monotonic()
        while pos < len(key):
            child = node.children.get(child_key(salt, key[pos]))
            if child is None:
                new = TreeNode(list(key[pos:]), np.array(value[pos:], dtype=np.int64), node, salt)
                new.last_access, new.access_time = stamp, now
                node.children[new.index_key] = new
                self.evictable_size += len(new.key)
                self.num_nodes += 1
                return pos
            n = _common_len(child.key, key[pos:pos + len(child.key)])
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access, child.access_time = stamp, now
            pos += n
            node = child
        return pos

    # ---------------------------------------------------------------- requests
    def _take_over(self, key: list[int], slots: np.ndarray, cached_len: int, salt: Optional[str]) -> bool:
        """Insert the request's tokens and free its duplicates of tokens the tree already held
        past ``cached_len``; True when there were any (its row must then use the tree's slots)."""
        already = self.insert(key, slots, salt)
        if already > cached_len:
            if self.on_duplicates is not None:
                tree_slots = self.match_prefix(key[:already], salt)[0]
                self.on_duplicates(tree_slots[cached_len:already], slots[cached_len:already])
            self.free_fn(np.array(slots[cached_len: already], dtype=np.int64))
        return already > cached_len

    def cache_unfinished(self, key: list[int], slots: np.ndarray, cached_len: int,
                         node: TreeNode, salt: Optional[str] = None) -> Optional[Cached]:
        rewritten = self._take_over(key, slots, cached_len, salt)
        tree_slots, last = self.match_prefix(key, salt)
        assert len(tree_slots) == len(key)
        self.inc_lock_ref(last)
        self.dec_lock_ref(node)
        return Cached(last, tree_slots if rewritten else None)

    def cache_finished(self, key: list[int], slots: np.ndarray, cached_len: int, node: TreeNode,
                       salt: Optional[str] = None) -> None:
        self._take_over(key, slots, cached_len, salt)
        self.dec_lock_ref(node)

    # ---------------------------------------------------------------- locking
    def inc_lock_ref(self, node: TreeNode) -> None:
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable_size -= len(node.key)
                self.protected_size += len(node.key)
            node.lock_ref += 1
            node = node.parent

    def dec_lock_ref(self, node: TreeNode) -> None:
        while node is not self.root:
            if node.lock_ref == 1:
                self.evictable_size += len(node.key)
                self.protected_size -= len(node.key)
            node.lock_ref -= 1
            assert node.lock_ref >= 0, "radix cache: lock_ref underflow"
            node = node.parent

    # ---------------------------------------------------------------- eviction
    def _leaves(self) -> list[TreeNode]:
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            if not node.children and node is not self.root:
                out.append(node)
            stack.extend(node.children.values())
        return out

    def evict(self, num_tokens: int) -> int:
        if num_tokens <= 0 or self.evictable_size == 0:
            return 0
        heap = [(n.last_access, id(n), n) for n in self._leaves() if n.lock_ref == 0]
        heapq.heapify(heap)
        freed = nodes = 0
        while freed < num_tokens and heap:
            _, _, node = heapq.heappop(heap)
            self.free_fn(node.value)
            freed += len(node.key)
            nodes += 1
            self.evictable_size -= len(node.key)
            parent = node.parent
            del parent.children[node.index_key]
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, id(parent), parent))
        self.evicted_tokens += freed
        self.num_nodes -= nodes
        self.counters.record_eviction(nodes, freed)
        return freed

    # ---------------------------------------------------------------- introspection
    def all_nodes(self) -> list[TreeNode]:
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out
