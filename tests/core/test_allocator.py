"""SlotAllocator (KV slots, slot 0 reserved) and ReqToTokenPool (request rows): exact sizes,
lowest-first reuse, failed allocations that take nothing.  The random alloc/free state
machines are in test_allocator_fuzz.py."""
from __future__ import annotations

import numpy as np
import pytest

from radixserve.mem_cache.allocator import SlotAllocator
from radixserve.mem_cache.req_to_token import ReqToTokenPool


# --------------------------------------------------------------------------- unit tests
def test_rejects_pool_without_real_slots():
    with pytest.raises(ValueError):
        SlotAllocator(1)
    a = SlotAllocator(2)  # only slot 1
    assert a.available_size() == 1
    assert a.alloc(2) is None
    assert a.alloc(1).tolist() == [1]
    assert a.alloc(1) is None
    assert a.available_size() == 0


def test_fresh_allocator_hands_out_ascending_without_slot_0():
    a = SlotAllocator(10)
    assert a.available_size() == 9
    assert a.free_slots().tolist() == list(range(1, 10))
    out = a.alloc(4)
    assert out.dtype == np.int64
    assert out.tolist() == [1, 2, 3, 4]
    assert a.alloc(0).size == 0
    assert a.available_size() == 5


def test_freed_slots_are_reused_lowest_first_after_merge():
    a = SlotAllocator(10)
    x = a.alloc(9)
    a.free(x[[7, 2, 5]])  # slots 8, 3, 6, pending (not merged yet)
    assert a.available_size() == 3
    assert a.alloc(1).tolist() == [3]  # short -> merge + sort -> lowest first
    assert a.alloc(2).tolist() == [6, 8]
    assert a.alloc(1) is None


def test_short_alloc_takes_nothing():
    a = SlotAllocator(8)
    a.alloc(3)
    a.free(np.array([2], dtype=np.int64))
    before = a.free_slots().tolist()
    assert a.alloc(len(before) + 1) is None
    assert a.available_size() == len(before)
    assert a.free_slots().tolist() == before


def test_free_accepts_int32_and_empty():
    a = SlotAllocator(6)
    x = a.alloc(5)
    a.free(np.empty(0, dtype=np.int64))
    assert a.available_size() == 0
    a.free(x[:2].astype(np.int32))
    assert a.available_size() == 2
    got = a.alloc(2)
    assert got.dtype == np.int64 and got.tolist() == [1, 2]


def test_reset_frees_everything():
    a = SlotAllocator(7)
    a.alloc(4)
    a.free(np.array([1], dtype=np.int64))
    a.reset()
    assert a.available_size() == 6
    assert a.free_slots().tolist() == list(range(1, 7))


def test_req_to_token_pool_basics():
    p = ReqToTokenPool(3, 16)
    assert p.table.shape == (3, 16) and p.table.dtype == np.int32
    assert int(np.abs(p.table).sum()) == 0
    assert [p.alloc(), p.alloc(), p.alloc()] == [0, 1, 2]  # lowest first
    assert p.alloc() is None
    assert p.available_size() == 0
    p.free(1)
    assert p.available_size() == 1
    assert p.alloc() == 1
    p.reset()
    assert p.available_size() == 3
    assert sorted(p.alloc() for _ in range(3)) == [0, 1, 2]
