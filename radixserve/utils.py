"""Process-level helpers."""
from __future__ import annotations

import ctypes
import os
import uuid


def tune_malloc() -> None:
    """Keep freed large blocks in the heap instead of returning them to the OS.

    glibc serves big allocations with mmap and unmaps them on free, so every step's
    activation tensors page-fault afresh; on this 2-core CPU that cost 4x on a 30 MB
    gather.  Raising the mmap and trim thresholds keeps the memory mapped.
    """
    if os.environ.get("RADIXSERVE_NO_MALLOC_TUNING"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    libc.mallopt(m_mmap_threshold, 1 << 30)
    libc.mallopt(m_trim_threshold, 2**31 - 1)


def new_rid() -> str:
    return uuid.uuid4().hex
