"""The hierarchical radix cache's tree and tier bookkeeping, against a fake worker.

The fake worker keeps, for every pool and host slot and every block row, the identity of the
KV it holds (a hash of the token prefix that produced it), so each test checks that what a
load puts into the pool is the KV of exactly the prefix the tree says; the memory invariants
(pool slots, host slots, block table) are checked after every operation."""
from __future__ import annotations

import random
from typing import Optional

import numpy as np
import pytest
import torch

from radixserve.ipc.tier_link import KVTierReply, KVTierReq
from radixserve.mem_cache.allocator import SlotAllocator
from radixserve.mem_cache.hiradix_cache import HiRadixCache
from radixserve.mem_cache.invariants import check_memory_invariants


class FakeTiers:
    def __init__(self, pool_slots: int, host_slots: int) -> None:
        self.pool: list[Optional[int]] = [None] * pool_slots
        self.host: list[Optional[int]] = [None] * host_slots
        self.disk: dict[str, list[int]] = {}
        self.corrupt: set[str] = set()
        self.fail_writes = False
        self.lost: list[str] = []
        self.moves: list[str] = []

    def apply_tiers(self, req: KVTierReq) -> KVTierReply:
        failed = []
        for i, m in enumerate(req.moves):
            self.moves.append(m.kind)
            if m.kind == "pool_to_host":
                for s, d in zip(m.src, m.dst):
                    self.host[d] = self.pool[s]
            elif m.kind == "host_to_pool":
                for s, d in zip(m.src, m.dst):
                    self.pool[d] = self.host[s]
            elif m.kind == "host_to_disk":
                assert len(m.src) == len(m.tokens)
                if self.fail_writes:
                    self.lost.append(m.block)
                else:
                    self.disk[m.block] = [self.host[s] for s in m.src]
            elif m.kind == "disk_to_pool":
                rows = self.disk.get(m.block)
                if rows is None or m.block in self.corrupt or m.offset + len(m.dst) > len(rows):
                    failed.append(i)
                    continue
                for j, d in enumerate(m.dst):
                    self.pool[d] = rows[m.offset + j]
            elif m.kind == "drop_block":
                self.disk.pop(m.block, None)
        lost, self.lost = self.lost, []
        return KVTierReply(failed, lost)


def kv_id(key: list[int], i: int, salt: Optional[str]) -> int:
    return hash((salt, tuple(key[: i + 1])))


def make(pool_slots: int = 65, host_slots: int = 161, disk: int = 0, write_through: bool = False):
    pool = SlotAllocator(pool_slots)
    link = FakeTiers(pool_slots, host_slots)
    return pool, link, HiRadixCache(pool, link, host_slots, disk, 1, write_through)


def serve(pool: SlotAllocator, link: FakeTiers, cache: HiRadixCache, key: list[int], salt: Optional[str] = None) -> int:
    """What a request does: load, match (checking the KV it gets), compute the rest, give it back.
    Returns how many tokens it found cached."""
    cache.fetch(key, salt)
    slots, node = cache.match_prefix(key, salt)
    for i, s in enumerate(slots.tolist()):
        assert link.pool[s] == kv_id(key, i, salt), f"wrong KV at position {i}"
    cache.inc_lock_ref(node)
    need = len(key) - len(slots)
    if need > pool.available_size():
        cache.evict(need - pool.available_size())
    new = pool.alloc(need)
    assert new is not None
    for j, s in enumerate(new.tolist()):
        link.pool[s] = kv_id(key, len(slots) + j, salt)
    cache.cache_finished(key, np.concatenate([slots, new]), len(slots), node, salt)
    check_memory_invariants(pool, cache, [])
    return len(slots)


def doc(seed: int, n: int = 30) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 1000) for _ in range(n)]


@pytest.mark.parametrize("write_through", [False, True])
def test_evicted_prefixes_come_back_from_host(write_through):
    pool, link, cache = make(write_through=write_through)
    docs = [doc(i) for i in range(5)]  # 150 tokens: more than the pool's 64, fewer than the host tier's 160
    for d in docs:
        serve(pool, link, cache, d)
    for d in reversed(docs):
        assert serve(pool, link, cache, d) == len(d)  # every one cached, from the pool or the host tier
    assert cache.tiers.loaded["host"] > 0 and cache.tiers.loaded["disk"] == 0
    assert ("pool_to_host" in link.moves) and ("host_to_pool" in link.moves)


def test_disk_tier_below_the_host_tier():
    pool, link, cache = make(host_slots=41, disk=10_000_000)
    docs = [doc(i) for i in range(8)]  # 240 tokens against 64 + 40 slots
    for d in docs:
        serve(pool, link, cache, d)
    assert link.disk and cache.tiers.disk_used > 0
    for d in docs:
        cache.prefetch(d)  # what a queued request does: read its blocks ahead
        assert serve(pool, link, cache, d) == len(d)
    assert cache.tiers.loaded["disk"] > 0 and "prefetch_block" in link.moves


def test_a_block_that_does_not_load_is_recomputed():
    pool, link, cache = make(host_slots=41, disk=10_000_000)
    docs = [doc(i) for i in range(8)]
    for d in docs:
        serve(pool, link, cache, d)
    link.corrupt.update(link.disk)
    hits = [serve(pool, link, cache, d) for d in docs]
    assert cache.tiers.failed_loads > 0 and min(hits) < 30  # some came back from disk as nothing
    assert [serve(pool, link, cache, d) for d in docs[-2:]] == [30, 30]


def test_failed_writes_drop_the_nodes_that_needed_them():
    pool, link, cache = make(host_slots=41, disk=10_000_000)
    link.fail_writes = True
    for i in range(8):
        serve(pool, link, cache, doc(i))
    assert cache.tiers.lost_blocks > 0 and not cache.tiers.blocks


def test_disk_budget_is_kept_and_oldest_blocks_go_first():
    pool, link, cache = make(host_slots=41, disk=cache_bytes(3))
    for i in range(12):
        serve(pool, link, cache, doc(i))
        assert cache.tiers.disk_used <= cache.tiers.disk_budget
    assert len(link.disk) == len(cache.tiers.blocks) <= 3
    assert serve(pool, link, cache, doc(0)) == 0  # the oldest is gone from every tier


def cache_bytes(blocks: int) -> int:
    from radixserve.mem_cache.tier_state import BLOCK_OVERHEAD

    return blocks * (30 * 1 + 8 * 30 + BLOCK_OVERHEAD)


def test_partial_match_into_a_lower_tier_node():
    pool, link, cache = make(host_slots=41, disk=10_000_000)
    system = doc(100, 20)
    serve(pool, link, cache, system + doc(1, 10))
    for i in range(10, 16):  # push it down to disk
        serve(pool, link, cache, doc(i))
    assert serve(pool, link, cache, system + doc(2, 10)) == 20  # the shared part, split out of its block


def test_salted_prefixes_stay_salted_in_every_tier():
    pool, link, cache = make(host_slots=41, disk=10_000_000)
    secret = doc(7)
    serve(pool, link, cache, secret, salt="tenant-a")
    for i in range(10, 16):
        serve(pool, link, cache, doc(i))
    assert serve(pool, link, cache, secret, salt="tenant-b") == 0
    assert serve(pool, link, cache, secret) == 0
    assert serve(pool, link, cache, secret, salt="tenant-a") == 30


def test_flush_drops_every_tier():
    pool, link, cache = make(host_slots=41, disk=10_000_000)
    for i in range(8):
        serve(pool, link, cache, doc(i))
    assert cache.flush()
    check_memory_invariants(pool, cache, [])
    assert cache.num_nodes == 0 and cache.tiers.host_tokens == 0 and not cache.tiers.blocks and not link.disk


@pytest.mark.parametrize("seed", range(6))
def test_random_traffic_keeps_every_invariant(seed):
    rng = random.Random(seed)
    pool, link, cache = make(pool_slots=97, host_slots=rng.choice([25, 33, 129]), disk=rng.choice([0, cache_bytes(6)]),
                             write_through=rng.random() < 0.5)
    systems = [doc(1000 + i, rng.randrange(5, 25)) for i in range(3)]
    for _ in range(150):
        key = rng.choice(systems) + doc(rng.randrange(40), rng.randrange(1, 30))
        salt = rng.choice([None, None, "s"])
        serve(pool, link, cache, key, salt)
        if rng.random() < 0.1:
            link.corrupt.add(rng.choice(list(link.disk) or ["none"]))
    assert cache.stats()["host_hit_tokens"] + cache.stats()["disk_hit_tokens"] > 0
    assert np.isfinite(cache.stats()["hit_rate"])


@pytest.mark.parametrize("kind,tol", [("auto", 0.0), ("int8", 1 / 127), ("fp8_e4m3", 1 / 8)])
def test_host_rows_round_trip(kind, tol):
    from radixserve.worker.tiers.kv_codec import HostRows

    torch.manual_seed(0)
    rows = torch.randn(5, 3, 64) * torch.tensor([0.01, 1.0, 300.0])[None, :, None]  # heads of very different scale
    host = HostRows(9, 3, 64, torch.float32, kind)
    idx = torch.tensor([7, 1, 4, 2, 8])
    host.put(idx, rows)
    back = host.get(idx)
    err = (back - rows).abs() / rows.abs().amax(-1, keepdim=True)  # relative to each head's largest value
    assert back.dtype == torch.float32 and float(err.max()) <= tol
    assert HostRows.slot_bytes(3, 64, torch.float32, kind) == (3 * 68 if kind != "auto" else 3 * 256)


def test_a_node_demoted_and_written_to_disk_in_one_eviction():
    """Two pool leaves evicted at once through a host tier that holds one: the first is demoted,
    then pushed on to disk by the second; its block must hold its KV (moves stay in order)."""
    pool, link, cache = make(pool_slots=45, host_slots=25, disk=10_000_000)
    a, b = doc(1, 20), doc(2, 20)
    serve(pool, link, cache, a)
    serve(pool, link, cache, b)
    serve(pool, link, cache, doc(3, 40))  # evicts a and b in one call
    assert cache.tiers.blocks
    assert serve(pool, link, cache, a) == 20  # from disk, its KV checked position by position
