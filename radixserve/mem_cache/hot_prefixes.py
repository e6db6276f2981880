"""Warm restart's view of the radix tree: pick the hottest prefixes, put restored ones back.

``select_hot`` reads the tree (no splits, locks or LRU stamps change); ``insert_restored``
inserts unlocked, evictable nodes through ``PrefixCache.insert`` and hands every slot it does
not keep to ``free_fn``, so the memory invariants hold afterwards; the hottest restored
nodes get the newest LRU stamps, so eviction takes the coldest first.  Scheduler thread only
(through ``KVManager``).
"""
from __future__ import annotations

import heapq
import itertools
from typing import Callable, Optional

import numpy as np

from radixserve.ipc.persist_link import PersistNode
from radixserve.mem_cache.prefix_cache import PrefixCache
from radixserve.mem_cache.tree_node import TreeNode, child_key, clock


def _heat(node: TreeNode) -> tuple[int, int]:
    """Hit count first (where the tree keeps one), then recency."""
    return getattr(node, "hit_count", 0), node.last_access


def select_hot(root: TreeNode, max_tokens: int) -> tuple[list[PersistNode], np.ndarray]:
    """Up to ``max_tokens`` cached tokens as whole root-to-node paths, hottest first: nodes in
    parent-first order (a node's KV is only valid after its ancestors'), the last one possibly
    cut short, and the slots of their tokens concatenated in the same order.  Salted nodes are
    included with their salt (each namespace's subtree hangs off the root)."""
    order = itertools.count()
    heap: list = []

    def push(node: TreeNode, parent: int) -> None:
        hits, last = _heat(node)
        heapq.heappush(heap, (-hits, -last, next(order), node, parent))

    for child in root.children.values():
        if child.value is not None:  # the pool's nodes only (a hierarchical cache's lower tiers stay there)
            push(child, -1)
    nodes: list[PersistNode] = []
    slots: list[np.ndarray] = []
    room = max_tokens
    while heap and room > 0:
        *_, node, parent = heapq.heappop(heap)
        take = min(len(node.key), room)
        nodes.append(PersistNode(parent, node.salt, np.asarray(node.key[:take], dtype=np.int64)))
        slots.append(node.value[:take])
        room -= take
        if take == len(node.key):
            for child in node.children.values():
                if child.value is not None:
                    push(child, len(nodes) - 1)
    return nodes, (np.concatenate(slots) if slots else np.empty(0, dtype=np.int64))


def insert_restored(cache: PrefixCache, nodes: list[PersistNode], slots: np.ndarray,
                    free_fn: Callable[[np.ndarray], None]) -> int:
    """Insert ``nodes`` (parent-first, ``slots`` holding their tokens' KV in node order) as
    unlocked tree nodes; slots of tokens the tree already held are freed.  Returns how many
    tokens the tree took."""
    paths: list[tuple[list[int], np.ndarray]] = []
    taken, at = 0, 0
    for node in nodes:
        n = len(node.tokens)
        own = slots[at:at + n]
        at += n
        key, value = (paths[node.parent] if node.parent >= 0 else ([], own[:0]))
        key, value = key + node.tokens.tolist(), np.concatenate([value, own])
        paths.append((key, value))
        before = len(key) - n
        already = cache.insert(key, value, node.salt)
        dup = max(0, min(already, len(key)) - before)  # this node's tokens that were cached already
        if dup:
            free_fn(own[:dup].copy())
        taken += n - dup
    for (key, _), node in reversed(list(zip(paths, nodes))):  # the hottest get the newest LRU stamps
        _touch(cache.root, key, node.salt)
    return taken


def _touch(root: TreeNode, key: list[int], salt: Optional[str]) -> None:
    """Stamp the nodes along ``key`` as just used (no splits, unlike ``match_prefix``)."""
    node, pos, stamp = root, 0, next(clock)
    while pos < len(key):
        child = node.children.get(child_key(salt, key[pos]))
        if child is None:
            return
        child.last_access = stamp
        pos += len(child.key)
        node = child
