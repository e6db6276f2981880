"""Token-slot allocator over the KV pool (page size 1)."""
from __future__ import annotations

import numpy as np


class SlotAllocator:
    """Hands out KV slot indices in ``1 .. num_slots-1`` (slot 0 is padding).

    Contract: ``alloc(n)`` returns an int64 array of ``n`` distinct free slots or None when
    fewer than ``n`` are free (nothing is taken then); ``free(slots)`` returns slots that
    were allocated.  Freed slots are reused lowest-first after a sort, so long-lived
    prefixes tend to sit in contiguous runs.  Slots are numpy arrays (the scheduler process
    never imports torch); ``free`` also takes anything ``np.asarray`` reads as integers.
    """

    def __init__(self, num_slots: int) -> None:
        if num_slots < 2:
            raise ValueError("max_total_tokens: the KV pool needs at least 2 slots")
        self.num_slots = num_slots
        self._free = np.arange(1, num_slots, dtype=np.int64)
        self._pending: list[np.ndarray] = []
        self._pending_size = 0

    def available_size(self) -> int:
        return int(self._free.size) + self._pending_size

    def alloc(self, n: int) -> np.ndarray | None:
        if n > self._free.size and self._pending:
            self._merge()
        if n > self._free.size:
            return None
        out, self._free = self._free[:n], self._free[n:]
        return out

    def free(self, slots: np.ndarray) -> None:
        slots = np.asarray(slots, dtype=np.int64)
        if slots.size:
            self._pending.append(slots)
            self._pending_size += int(slots.size)

    def _merge(self) -> None:
        self._free = np.sort(np.concatenate([self._free, *self._pending]))
        self._pending.clear()
        self._pending_size = 0

    def free_slots(self) -> np.ndarray:
        """All currently free slots (for invariant checks)."""
        self._merge()
        return self._free.copy()

    def reset(self) -> None:
        self.__init__(self.num_slots)
