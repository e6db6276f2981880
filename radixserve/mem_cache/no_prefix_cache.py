"""The prefix cache of ``--disable-radix-cache``: it shares nothing.

Every request computes its whole prompt and holds all of its slots (``cached_len`` stays 0,
``last_node`` is the root, which is never locked or evicted); a finished or retracted
request's slots go straight back to the allocator.  The hit accounting still counts the
queried tokens, so the hit rate reads 0.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from radixserve.mem_cache.prefix_cache import Cached, PrefixCache
from radixserve.mem_cache.tree_node import TreeNode

_EMPTY = np.empty(0, dtype=np.int64)


class NoPrefixCache(PrefixCache):
    """The ``PrefixCache`` contract with an always-empty tree."""

    kind = "none"

    def match_prefix(self, key: list[int], salt: Optional[str] = None) -> tuple[np.ndarray, TreeNode]:
        return _EMPTY, self.root

    def insert(self, key: list[int], value: np.ndarray, salt: Optional[str] = None) -> int:
        return 0  # nothing is stored: ``value`` stays with the caller

    def inc_lock_ref(self, node: TreeNode) -> None:
        assert node is self.root, "NoPrefixCache: only the root can be locked"

    def dec_lock_ref(self, node: TreeNode) -> None:
        assert node is self.root, "NoPrefixCache: only the root can be unlocked"

    def cache_unfinished(self, key: list[int], slots: np.ndarray, cached_len: int,
                         node: TreeNode, salt: Optional[str] = None) -> Optional[Cached]:
        return None  # the request keeps its slots

    def cache_finished(self, key: list[int], slots: np.ndarray, cached_len: int, node: TreeNode,
                       salt: Optional[str] = None) -> None:
        self.free_fn(np.array(slots[cached_len:], dtype=np.int64))

    def evict(self, num_tokens: int) -> int:
        return 0

    def all_nodes(self) -> list[TreeNode]:
        return []
