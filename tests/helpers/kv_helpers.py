"""Helpers shared by the prefix-cache and KVManager tests (test_radix_cache.py,
test_no_prefix_cache.py, test_kv_manager.py and the simulator in kv_sim.py): int64 slot
arrays, a free_fn that records what it frees, and a cache or a KVManager built over parts
the test keeps."""
from __future__ import annotations

import numpy as np

from radixserve.mem_cache.allocator import SlotAllocator
from radixserve.mem_cache.no_prefix_cache import NoPrefixCache
from radixserve.mem_cache.prefix_cache import PrefixCache
from radixserve.mem_cache.radix_cache import RadixCache
from radixserve.mem_cache.req_to_token import ReqToTokenPool
from radixserve.scheduler.kv_manager import KVManager


def T(*xs: int) -> np.ndarray:
    return np.array(xs, dtype=np.int64)


class Recorder:
    """free_fn that remembers each freed batch of slots, in order."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def __call__(self, slots: np.ndarray) -> None:
        self.batches.append(slots.tolist())

    def flat(self) -> list[int]:
        return [s for b in self.batches for s in b]


def make_cache(disable: bool = False) -> tuple[PrefixCache, Recorder]:
    rec = Recorder()
    return (NoPrefixCache if disable else RadixCache)(rec), rec


def make_kv(num_slots: int, max_rows: int, max_ctx: int,
            disable: bool = False) -> tuple[KVManager, SlotAllocator, PrefixCache, ReqToTokenPool]:
    """A KVManager over parts the test keeps, to look behind the interface."""
    allocator = SlotAllocator(num_slots)
    cache = (NoPrefixCache if disable else RadixCache)(allocator.free)
    rows = ReqToTokenPool(max_rows, max_ctx)
    return KVManager.from_parts(allocator, cache, rows), allocator, cache, rows
