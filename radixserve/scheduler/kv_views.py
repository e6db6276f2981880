"""The read-only views of ``KVManager`` for the inspector and the stats, and warm restart's
exchange with the tree (a mixin: ``KVManager`` is the one class; these read or write only what
its contract says, on the scheduler thread)."""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from radixserve.ipc.persist_link import PersistNode
from radixserve.mem_cache.allocator import SlotAllocator
from radixserve.mem_cache.hiradix_cache import HiRadixCache
from radixserve.mem_cache.hot_prefixes import insert_restored, select_hot
from radixserve.mem_cache.prefix_cache import PrefixCache
from radixserve.mem_cache.radix_cache import RadixCache
from radixserve.mem_cache.swa_slots import SwaSlotAllocator
from radixserve.mem_cache.tree_inspect import tree_snapshot


class KVViews:
    _allocator: SlotAllocator
    _cache: PrefixCache
    _swa: Optional[SwaSlotAllocator]
    capacity: int

    def stats(self) -> dict[str, Any]:
        s: dict[str, Any] = dict(self._cache.stats())
        s.update(free_slots=self._allocator.available_size(), num_slots=self.capacity)
        if self._swa is not None:
            s.update(sliding_free_slots=self._swa.sliding_available(), sliding_num_slots=self._swa.num_swa_slots - 1)
        return s

    def cache_tree(self, max_depth: int, max_nodes: int, with_tokens: bool) -> dict[str, Any]:
        """The inspector's bounded, read-only snapshot of the tree (``mem_cache/tree_inspect.py``)."""
        return tree_snapshot(self._cache, max_depth, max_nodes, with_tokens)

    def cache_stats(self) -> dict[str, Any]:
        """The inspector's counters: hit rate and evictions over time windows, tree and KV sizes."""
        c, free = self._cache, self._allocator.available_size()
        s: dict[str, Any] = {"cache": c.kind, **c.counters.snapshot()}
        s["tree"] = {"tokens": c.total_size(), "nodes": c.num_nodes, "evictable_tokens": c.evictable_size,
                     "protected_tokens": c.protected_size}
        s["kv"] = {"num_slots": self.capacity, "free_slots": free, "cached_slots": c.total_size(),
                   "held_slots": self.capacity - free - c.total_size(),
                   "used_fraction": (self.capacity - free) / max(1, self.capacity)}
        if isinstance(c, HiRadixCache):
            t = c.tiers
            s["tiers"] = {
                "pool": {"tokens": c.total_size(), "slots": self.capacity},
                "host": {"tokens": t.host_tokens, "slots": t.host.num_slots - 1, "hit_tokens": t.loaded["host"]},
                "disk": {"blocks": len(t.blocks), "bytes": t.disk_used, "budget_bytes": t.disk_budget,
                         "hit_tokens": t.loaded["disk"]},
                "failed_loads": t.failed_loads, "lost_blocks": t.lost_blocks}
        if self._swa is not None:
            sw = self._swa
            s["kv"].update(sliding_num_slots=sw.num_swa_slots - 1, sliding_free_slots=sw.sliding_available(),
                           sliding_window=sw.window)
        return s

    # ------------------------------------------------------------------ warm restart
    def hot_prefixes(self, max_tokens: int) -> tuple[list[PersistNode], np.ndarray]:
        """The hottest cached prefixes (``mem_cache/hot_prefixes.py``) and their slots;
        read-only.  Nothing without a sharing cache."""
        if not isinstance(self._cache, RadixCache) or self._swa is not None:
            return [], np.empty(0, dtype=np.int64)
        return select_hot(self._cache.root, max_tokens)

    def reserve_for_restore(self, n: int) -> np.ndarray:
        """Up to ``n`` free slots (no eviction) that must go back through ``adopt``."""
        restorable = isinstance(self._cache, RadixCache) and self._swa is None
        n = min(n, self._allocator.available_size()) if restorable else 0
        return self._allocator.alloc(n) if n > 0 else np.empty(0, dtype=np.int64)

    def adopt(self, nodes: list[PersistNode], slots: np.ndarray, used: int) -> int:
        """Insert restored nodes whose KV the worker wrote into ``slots[:used]`` (unlocked,
        evictable); frees every reserved slot the tree does not keep.  Returns tokens kept."""
        taken = insert_restored(self._cache, nodes, slots[:used], self._allocator.free) if used else 0
        self._allocator.free(slots[used:].copy())
        return taken
