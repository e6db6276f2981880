"""Which tokens' sliding-window KV no one can read again, freed when the sliding pool runs short.

A running request at ``kv_len`` reads, in its sliding layers, only its last ``window`` tokens
(``swa_slots.usable_prefix`` uses the same ``window``, one more than needed).  So a token's
sliding slot can go when no running request's window covers it:

* a request's own tokens (``row[cached_len:kv_len]``, not shared) before ``kv_len - window``;
* a tree node's tokens before the window of every request that locks it (all of them when
  no window reaches the node).  A tree token is kept for future matches while there is room:
  nodes are reclaimed least recently used first, and only as much as the caller needs; a later match that ends within ``window`` of a
  reclaimed token is cut short (``usable_prefix``), so it is recomputed, never read.

The full slots are untouched: the tree keeps every node (the full layers' KV is still good).
Read the tree and the requests; free only through ``SwaSlotAllocator.release_sliding``.
"""
from __future__ import annotations

from typing import Iterable, Iterator, NamedTuple, Optional

import numpy as np

from radixserve.mem_cache.prefix_cache import PrefixCache
from radixserve.mem_cache.swa_slots import SwaSlotAllocator
from radixserve.mem_cache.tree_node import TreeNode


class Window(NamedTuple):
    """What one running (or being admitted) request reads: its row of slots, the tokens the
    tree owns (``cached_len``, locked through ``node``) and the tokens computed (``kv_len``)."""

    row: np.ndarray
    cached_len: int
    kv_len: int
    node: Optional[TreeNode]


def _candidates(alloc: SwaSlotAllocator, cache: PrefixCache, windows: list[Window]) -> Iterator[np.ndarray]:
    """Full slots whose sliding KV no window reads: requests' own tokens first, then the tree's
    nodes no request needs, least recently used first (some may have no sliding slot left)."""
    w = alloc.window
    for win in windows:
        hi = win.kv_len - w
        if hi > win.cached_len:
            yield win.row[win.cached_len:hi]
    keep_from: dict[int, int] = {}  # a node some window reads: its tokens before this index are free to go
    for win in windows:
        node, end = win.node, win.cached_len
        while node is not None and node is not cache.root and end > win.kv_len - w:
            start = end - len(node.key)
            keep_from[id(node)] = min(keep_from.get(id(node), len(node.key)), max(0, win.kv_len - w - start))
            end = start
            node = node.parent
    for node in sorted(cache.all_nodes(), key=lambda nd: nd.last_access):
        cut = keep_from.get(id(node), len(node.key))
        if cut > 0:
            yield node.value[:cut]


def reclaim_sliding(alloc: SwaSlotAllocator, cache: PrefixCache, windows: Iterable[Window], n: int) -> int:
    """Free at least ``n`` sliding slots no window reads (when there are so many); returns how
    many were freed.  Requests' own tokens go first, then unneeded tree nodes, LRU first."""
    freed = 0
    for slots in _candidates(alloc, cache, list(windows)):
        if freed >= n:
            break
        freed += alloc.release_sliding(slots)
    return freed


def reclaimable(alloc: SwaSlotAllocator, cache: PrefixCache, windows: Iterable[Window]) -> int:
    """How many sliding slots ``reclaim_sliding`` could free now (nothing is freed)."""
    swa_of = alloc.swa_of
    return sum(int((swa_of[slots] > 0).sum()) for slots in _candidates(alloc, cache, list(windows)))


def transfer_sliding(alloc: SwaSlotAllocator, tree_slots: np.ndarray, dup_slots: np.ndarray) -> None:
    """A request computed tokens the tree already held (``dup_slots``, about to be freed, the
    same tokens at the same positions as ``tree_slots``): where the tree's copy lost its sliding
    KV and the request's has it, the tree's token takes the request's sliding slot."""
    swa_of = alloc.swa_of
    take = (swa_of[tree_slots] == 0) & (swa_of[dup_slots] > 0)
    if bool(take.any()):
        dst, src = tree_slots[take], dup_slots[take]
        swa_of[dst] = swa_of[src]
        swa_of[src] = 0
