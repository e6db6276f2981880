"""Warm restart's messages between the scheduler (owner of the tree and the slots) and the
model worker (owner of the KV tensors and the file on disk).

Both are requests with exactly one reply on the worker link, sent between steps:

* ``KVSaveReq``: the scheduler's hottest prefixes as tree nodes in parent-first order, with
  their slots; the worker copies the KV out of those slots before it replies (so the slots may
  be reused right after) and writes the file, before the reply when ``wait`` is set, else on a
  background thread.
* ``KVRestoreReq``: free slots the scheduler reserved (taken from its allocator); the worker
  fills them in order from its file and replies with the nodes it loaded and how many of the
  slots it used.  The scheduler inserts those nodes and frees the rest of the slots.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np


@dataclass
class PersistNode:
    """One tree node: ``tokens`` follow the tokens of node ``parent`` (an index into the same
    list, always smaller; -1 is the root); all nodes under one root child share ``salt``."""

    parent: int
    salt: Optional[str]
    tokens: np.ndarray  # int64 [n]


@dataclass
class KVSaveReq:
    nodes: list[PersistNode]
    slots: np.ndarray  # int64: the slots of every node's tokens, concatenated in node order
    wait: bool = False  # write the file before replying (shutdown)


@dataclass
class KVSaveReply:
    ok: bool
    message: str = ""
    num_tokens: int = 0
    num_bytes: int = 0


@dataclass
class KVRestoreReq:
    slots: np.ndarray  # int64 free slots the worker may fill, in order


@dataclass
class KVRestoreReply:
    nodes: list[PersistNode] = field(default_factory=list)
    used: int = 0  # slots[:used] now hold the nodes' KV, in node order
    message: str = ""  # why nothing was loaded (no file, a mismatch, corruption), or a summary
