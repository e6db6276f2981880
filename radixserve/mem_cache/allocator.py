"""Token-slot allocator over the KV pool (page size 1)."""
from __future__ import annotations

import torch


class SlotAllocator:
    """Hands out KV slot indices in ``1 .. num_slots-1`` (slot 0 is padding).

    Contract: ``alloc(n)`` returns an int64 tensor of ``n`` distinct free slots or None when
    fewer than ``n`` are free (nothing is taken then); ``free(slots)`` returns slots that
    were allocated.  Freed slots are reused lowest-first after a sort, so long-lived
    prefixes tend to sit in contiguous runs.
    """

    def __init__(self, num_slots: int) -> None:
        if num_slots < 2:
            raise ValueError("max_total_tokens: the KV pool needs at least 2 slots")
        self.num_slots = num_slots
        self._free = torch.arange(1, num_slots, dtype=torch.int64)
        self._pending: list[torch.Tensor] = []
        self._pending_size = 0

    def available_size(self) -> int:
        return int(self._free.numel()) + self._pending_size

    def alloc(self, n: int) -> torch.Tensor | None:
        if n > self._free.numel() and self._pending:
            self._merge()
        if n > self._free.numel():
            return None
        out, self._free = self._free[:n], self._free[n:]
        return out

    def free(self, slots: torch.Tensor) -> None:
        if slots.numel():
            self._pending.append(slots.to(torch.int64))
            self._pending_size += int(slots.numel())

    def _merge(self) -> None:
        self._free = torch.cat([self._free, *self._pending]).sort().values
        self._pending.clear()
        self._pending_size = 0

    def free_slots(self) -> torch.Tensor:
        """All currently free slots (for invariant checks)."""
        self._merge()
        return self._free.clone()

    def reset(self) -> None:
        self.__init__(self.num_slots)
