"""``KVSim`` over a KVManager with a sliding-window pool (``mem_cache/swa_slots.py``): the same
operations, where an allocation may also fail for want of sliding slots, and, after every
operation, beyond the memory invariants (both pools): every live request keeps the sliding KV
of its last ``WINDOW`` computed tokens and of its pending ones (what its sliding layers read)."""
from __future__ import annotations

import numpy as np

from radixserve.mem_cache.no_prefix_cache import NoPrefixCache
from radixserve.mem_cache.radix_cache import RadixCache
from radixserve.mem_cache.req_to_token import ReqToTokenPool
from radixserve.mem_cache.swa_slots import SwaSlotAllocator
from radixserve.scheduler.kv_manager import KVManager
from tests.helpers.kv_sim import MAX_CTX, MAX_ROWS, NUM_SLOTS, KVSim

SWA_SLOTS = 20  # 19 usable sliding slots for 31 full ones
WINDOW = 4


class SwaKVSim(KVSim):
    def __init__(self, disable: bool = False) -> None:
        super().__init__(disable)
        self.allocator = SwaSlotAllocator(NUM_SLOTS, SWA_SLOTS, WINDOW)
        self.cache = (NoPrefixCache if disable else RadixCache)(self.allocator.free)
        self.rows = ReqToTokenPool(MAX_ROWS, MAX_CTX)
        self.kv = KVManager.from_parts(self.allocator, self.cache, self.rows)

    def _alloc(self, n, req, allocate):
        sliding_ok = self.kv.sliding_fits(n)
        short = n > self.allocator.sliding_available()
        if not sliding_ok:  # nothing may be taken: the full-pool accounting must not see it
            self._event("sliding pool short")
            before = self.allocator.available_size() + self.cache.evictable_size
            assert not allocate()
            assert self.allocator.available_size() + self.cache.evictable_size == before
            return None
        slots = super()._alloc(n, req, allocate)
        if slots is not None and short:
            self._event("sliding slots reclaimed")
        return slots

    def check(self) -> None:
        super().check()
        swa_of = self.allocator.swa_of
        for r in self.live:
            row = self.kv.row(r)
            need = row[max(0, r.kv_len - WINDOW): r.kv_len + self.pending[r.rid]].astype(np.int64)
            assert bool((swa_of[need] > 0).all()), f"{r.rid} lost sliding KV its window reads"
