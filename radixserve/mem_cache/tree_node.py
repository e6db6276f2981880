"""A node of the prefix tree: an edge of token ids and the KV slots that hold them.

Cache isolation: every node carries the ``salt`` (namespace) of the requests that made it,
and a parent indexes it under ``child_key(salt, key[0])``: the bare token when unsalted,
``(salt, token)`` otherwise.  So a look-up with one salt can never walk into a node made
under another, and the namespaces share only the root (which holds no KV slot).
"""
from __future__ import annotations

import itertools
import time
from typing import Hashable, Optional

import numpy as np

clock = itertools.count()  # access stamps: eviction frees the least recently used leaves first


def child_key(salt: Optional[str], token: int) -> Hashable:
    """How a parent indexes a child whose edge starts with ``token`` in namespace ``salt``."""
    return token if salt is None else (salt, token)


class TreeNode:
    """``hit_count``: admissions whose cached prefix ran through this node (the inspector's
    per-node hits); ``access_time``: ``time.monotonic()`` of the last match or insert through it
    (``last_access`` is the logical LRU stamp eviction orders by).

    Tiers (``hiradix_cache.py``; a plain ``RadixCache`` uses ``value`` only): ``value`` is None
    when the node's KV is not in the pool, ``host`` its host-tier slots, ``disk`` its (block,
    first row) in the disk tier; a node of the hierarchical cache is in at least one of them."""

    __slots__ = ("key", "value", "children", "parent", "lock_ref", "last_access", "salt", "hit_count",
                 "access_time", "host", "disk")

    def __init__(self, key: list[int], value: Optional[np.ndarray], parent: Optional["TreeNode"],
                 salt: Optional[str] = None) -> None:
        self.key = key  # token ids on the edge from parent to this node
        self.value = value  # int64 KV slots, one per key token (None: not in the pool)
        self.children: dict[Hashable, TreeNode] = {}
        self.parent = parent
        self.lock_ref = 0
        self.last_access = next(clock)
        self.salt = salt  # the cache namespace (None: the shared one)
        self.hit_count = 0
        self.access_time = time.monotonic()
        self.host: Optional[np.ndarray] = None
        self.disk: Optional[tuple[str, int]] = None

    @property
    def index_key(self) -> Hashable:
        """The key under which ``parent.children`` holds this node."""
        return child_key(self.salt, self.key[0])
