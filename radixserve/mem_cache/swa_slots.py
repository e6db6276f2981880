"""The sliding-window pool: KV slots of the sliding layers, beside the full layers' slots.

A sliding-window layer with window ``W`` reads, for a token at position ``p``, only the keys
at ``p - W + 1 .. p``.  Keeping those layers' KV for every cached token wastes most of it on
long contexts, so (as SGLang's hybrid SWA memory does) the sliding layers get a pool of their
own, smaller than the full one.  Every token still has a *full slot* (the slot the radix tree,
the request rows and the full layers use); while its sliding layers' KV is kept it also has
a *sliding slot*, ``swa_of[full_slot]`` (0: none, freed or never given).

``SwaSlotAllocator`` is a ``SlotAllocator`` over the full slots that gives every slot it hands
out a sliding slot too and frees both, so every path that allocates or frees a token's slot
(admission, the tree's eviction, retraction, speculation's rejected tokens) keeps the two pools
in step without knowing of the second one.  Freeing only the sliding slot of tokens no window
can read again is ``release_sliding``; which tokens those are is ``swa_reclaim``'s business.

Contract: the scheduler thread only, like ``SlotAllocator``.  ``alloc(n)`` takes ``n`` full
and ``n`` sliding slots, or nothing; ``free(slots)`` frees both (a slot whose sliding slot
was released frees only its full slot).
"""
from __future__ import annotations

import numpy as np

from radixserve.mem_cache.allocator import SlotAllocator


class SwaSlotAllocator(SlotAllocator):
    """Full slots ``1..num_slots-1``, each with a sliding slot in ``1..num_swa_slots-1`` while
    its sliding layers' KV is kept.  ``window``: the longest sliding window of the model."""

    def __init__(self, num_slots: int, num_swa_slots: int, window: int) -> None:
        super().__init__(num_slots)
        if window < 1:
            raise ValueError("sliding window: must be >= 1")
        self.window = window
        self.sliding = SlotAllocator(num_swa_slots)
        self.swa_of = np.zeros(num_slots, dtype=np.int64)

    @property
    def num_swa_slots(self) -> int:
        return self.sliding.num_slots

    def sliding_available(self) -> int:
        return self.sliding.available_size()

    def alloc(self, n: int) -> np.ndarray | None:
        if n > self.sliding.available_size() or n > self.available_size():
            return None
        full, swa = super().alloc(n), self.sliding.alloc(n)
        assert full is not None and swa is not None  # both checked above
        self.swa_of[full] = swa
        return full

    def free(self, slots: np.ndarray) -> None:
        slots = np.asarray(slots, dtype=np.int64)
        if slots.size:
            self.release_sliding(slots)
            super().free(slots)

    def release_sliding(self, slots: np.ndarray) -> int:
        """Free the sliding slots of full ``slots`` (those that still have one); their full
        slots stay where they are.  Returns how many were freed."""
        slots = np.asarray(slots, dtype=np.int64)
        mapped = self.swa_of[slots]
        kept = mapped[mapped > 0]  # a copy (boolean indexing)
        if kept.size:
            self.sliding.free(kept)
            self.swa_of[slots] = 0
        return int(kept.size)

    def sliding_of(self, slots: np.ndarray) -> np.ndarray:
        """The sliding slot of each full slot (0: none), as int64 numpy (for the worker)."""
        return self.swa_of[np.asarray(slots, dtype=np.int64)]

    def reset(self) -> None:
        self.__init__(self.num_slots, self.sliding.num_slots, self.window)


def usable_prefix(swa_of: np.ndarray, slots: np.ndarray, window: int) -> int:
    """The longest prefix length ``m <= len(slots)`` of a cached match whose last ``window``
    tokens all keep their sliding KV (what the sliding layers of the token at ``m`` and after
    read; ``window`` is one more than they need, for margin).  A longer match would give the
    sliding layers keys that are gone, so the request recomputes from ``m``."""
    m = len(slots)
    if m == 0:
        return 0
    missing = np.flatnonzero(swa_of[np.asarray(slots, dtype=np.int64)] == 0).tolist()
    while missing and m > 0:
        last = missing[-1]
        if last < m - window:
            break  # every token of [m - window, m) keeps its sliding KV
        m = last  # the match must end before the missing token
        while missing and missing[-1] >= m:
            missing.pop()
    return m
