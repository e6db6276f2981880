"""Radix tree from token sequences to the KV slots that hold them (page size 1)."""
from __future__ import annotations

import heapq
import itertools
from typing import Callable, Optional

import torch

_EMPTY = torch.empty(0, dtype=torch.int64)
_clock = itertools.count()


class TreeNode:
    __slots__ = ("key", "value", "children", "parent", "lock_ref", "last_access")

    def __init__(self, key: list[int], value: torch.Tensor, parent: Optional["TreeNode"]) -> None:
        self.key = key  # token ids on the edge from parent to this node
        self.value = value  # int64 KV slots, one per key token
        self.children: dict[int, TreeNode] = {}
        self.parent = parent
        self.lock_ref = 0
        self.last_access = next(_clock)


def _common_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class RadixCache:
    """SGLang-style radix cache.

    Contract:
      * ``match_prefix(key)`` returns the slots of the longest cached prefix of ``key`` and
        the node where it ends, splitting a node so that the match ends on a boundary.
      * ``insert(key, value)`` stores ``value[i]`` as the slot of ``key[i]`` and returns how
        many leading tokens were already cached; the caller must free its own duplicate
        slots ``value[cached_before:returned]``.
      * ``inc_lock_ref/dec_lock_ref(node)`` lock or unlock the whole path to the root;
        locked nodes are never evicted.
      * ``evict(n)`` frees at least ``n`` tokens (when possible) from unlocked leaves in LRU
        order through ``free_fn`` and returns how many it freed.
    Every slot in the tree is owned by exactly one node.
    """

    def __init__(self, free_fn: Callable[[torch.Tensor], None], disable: bool = False) -> None:
        self.free_fn = free_fn
        self.disable = disable
        self.reset()

    # ---------------------------------------------------------------- bookkeeping
    def reset(self) -> None:
        self.root = TreeNode([], _EMPTY, None)
        self.root.lock_ref = 1
        self.evictable_size = 0
        self.protected_size = 0
        self.hit_tokens = 0
        self.query_tokens = 0
        self.evicted_tokens = 0

    def total_size(self) -> int:
        return self.evictable_size + self.protected_size

    def record_hit(self, matched: int, total: int) -> None:
        self.hit_tokens += matched
        self.query_tokens += total

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

    # ---------------------------------------------------------------- lookup
    def match_prefix(self, key: list[int]) -> tuple[torch.Tensor, TreeNode]:
        if self.disable or not key:
            return _EMPTY, self.root
        node, values, pos = self.root, [], 0
        stamp = next(_clock)
        while pos < len(key):
            child = node.children.get(key[pos])
            if child is None:
                break
            n = _common_len(child.key, key[pos:pos + len(child.key)])
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = stamp
            values.append(child.value)
            pos += n
            node = child
        value = torch.cat(values) if len(values) > 1 else (values[0] if values else _EMPTY)
        return value, node

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Cut ``child``'s edge after ``n`` tokens; returns the new upper node."""
        upper = TreeNode(child.key[:n], child.value[:n], child.parent)
        upper.lock_ref = child.lock_ref
        upper.last_access = child.last_access
        upper.children[child.key[n]] = child
        child.parent.children[child.key[0]] = upper
        child.parent = upper
        child.key = child.key[n:]
        child.value = child.value[n:]
        return upper

    # ---------------------------------------------------------------- insert
    def insert(self, key: list[int], value: torch.Tensor) -> int:
        if self.disable:
            return 0
        node, pos = self.root, 0
        stamp = next(_clock)
        while pos < len(key):
            child = node.children.get(key[pos])
            if child is None:
                new = TreeNode(list(key[pos:]), value[pos:].clone(), node)
                new.last_access = stamp
                node.children[key[pos]] = new
                self.evictable_size += len(new.key)
                return pos
            n = _common_len(child.key, key[pos:pos + len(child.key)])
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = stamp
            pos += n
            node = child
        return pos

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
        freed = 0
        while freed < num_tokens and heap:
            _, _, node = heapq.heappop(heap)
            self.free_fn(node.value)
            freed += len(node.key)
            self.evictable_size -= len(node.key)
            parent = node.parent
            del parent.children[node.key[0]]
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, id(parent), parent))
        self.evicted_tokens += freed
        return freed

    def flush(self) -> bool:
        """Drop every cached token; refused (False) while any node is locked.  The root
        (which running requests with nothing cached point at) and the stats survive."""
        if self.protected_size:
            return False
        self.evict(self.evictable_size)
        return True

    # ---------------------------------------------------------------- introspection
    def all_nodes(self) -> list[TreeNode]:
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out
