"""The request -> token-slot table."""
from __future__ import annotations

from typing import Any, Optional

import numpy as np


class ReqToTokenPool:
    """Rows of KV slots, one row per running request.

    Contract: ``alloc()`` returns a free row index or None; ``free(row)`` returns it.
    ``table[row, :n]`` holds the slots of the request's first ``n`` tokens.  The scheduler
    and each worker keep their own copy: the worker's copy is filled from step deltas.
    ``table`` is int32: a numpy array without ``device`` (the scheduler's, whose process never
    imports torch), a torch tensor on ``device`` (a worker's, which the attention reads).
    """

    def __init__(self, size: int, max_context_len: int, device: Optional[Any] = None) -> None:
        self.size = size
        self.max_context_len = max_context_len
        if device is None:
            self.table = np.zeros((size, max_context_len), dtype=np.int32)
        else:
            import torch

            self.table = torch.zeros((size, max_context_len), dtype=torch.int32, device=device)
        self._free = list(range(size - 1, -1, -1))

    def available_size(self) -> int:
        return len(self._free)

    def alloc(self) -> int | None:
        return self._free.pop() if self._free else None

    def free(self, row: int) -> None:
        self._free.append(row)

    def reset(self) -> None:
        self._free = list(range(self.size - 1, -1, -1))
