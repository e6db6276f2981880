"""A node of the prefix tree: an edge of token ids and the KV slots that hold them."""
from __future__ import annotations

import itertools
from typing import Optional

import torch

clock = itertools.count()  # access stamps: eviction frees the least recently used leaves first


class TreeNode:
    __slots__ = ("key", "value", "children", "parent", "lock_ref", "last_access")

    def __init__(self, key: list[int], value: torch.Tensor, parent: Optional["TreeNode"]) -> None:
        self.key = key  # token ids on the edge from parent to this node
        self.value = value  # int64 KV slots, one per key token
        self.children: dict[int, TreeNode] = {}
        self.parent = parent
        self.lock_ref = 0
        self.last_access = next(clock)
