"""Warm restart's pieces without a model: the file format (round trip, corruption, atomicity),
choosing the hottest prefixes, restoring them into a fresh tree, and the worker-side store."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from radixserve.config import CacheConfig
from radixserve.ipc.persist_link import KVRestoreReq, KVSaveReq, PersistNode
from radixserve.mem_cache.hot_prefixes import select_hot
from radixserve.mem_cache.kv_pool import KVPool
from radixserve.scheduler.cache_persist import CachePersister
from radixserve.scheduler.kv_manager import KVManager
from radixserve.worker.persist import file_format as prefix_file
from radixserve.worker.persist.file_format import PrefixFileError, read_prefix_file, write_prefix_file
from radixserve.worker.persist.store import FILE_NAME, PrefixStore

LAYERS, HEADS, DIM = 2, 2, 4


def _fp(dtype: str = "float32") -> dict:
    return {"config_sha256": "abc", "weights": [["model.safetensors", 10, "h"]], "dtype": dtype,
            "quantization": "none", "num_layers": LAYERS, "num_kv_heads": HEADS, "head_dim": DIM, "page_size": 1}


def _nodes() -> list[PersistNode]:
    return [PersistNode(-1, None, np.arange(5, dtype=np.int64)), PersistNode(0, None, np.array([7, 8])),
            PersistNode(-1, "tenant", np.array([1, 2, 3]))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_file_round_trip(tmp_path, dtype):
    k = [torch.randn(10, HEADS, DIM).to(dtype) for _ in range(LAYERS)]
    v = [torch.randn(10, HEADS, DIM).to(dtype) for _ in range(LAYERS)]
    path = str(tmp_path / "f.rsp")
    size = write_prefix_file(path, _fp(str(dtype)[6:]), _nodes(), k, v)
    assert size == os.path.getsize(path)
    f = read_prefix_file(path)
    assert f.fingerprint == _fp(str(dtype)[6:]) and f.num_tokens == 10
    assert [(n.parent, n.salt, n.tokens.tolist()) for n in f.nodes] == \
        [(n.parent, n.salt, n.tokens.tolist()) for n in _nodes()]
    for a, b in zip(k + v, f.k + f.v):
        assert torch.equal(a, b)
    assert os.listdir(tmp_path) == ["f.rsp"]  # no temporary file left behind


def _written(tmp_path) -> str:
    k = [torch.randn(10, HEADS, DIM) for _ in range(LAYERS)]
    path = str(tmp_path / "f.rsp")
    write_prefix_file(path, _fp(), _nodes(), k, k)
    return path


@pytest.mark.parametrize("damage", ["flip_payload", "flip_header", "truncate", "append", "magic", "empty"])
def test_damaged_file_is_refused(tmp_path, damage):
    path = _written(tmp_path)
    data = bytearray(open(path, "rb").read())
    if damage == "flip_payload":
        data[len(data) - 100] ^= 0xFF
    elif damage == "flip_header":
        data[20] ^= 0x01
    elif damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "append":
        data += b"\0" * 8
    elif damage == "magic":
        data[:8] = b"NOTAFILE"
    else:
        data = bytearray()
    open(path, "wb").write(bytes(data))
    with pytest.raises(PrefixFileError):
        read_prefix_file(path)


def test_failed_write_leaves_the_old_file(tmp_path, monkeypatch):
    path = _written(tmp_path)
    before = open(path, "rb").read()

    def boom(*a, **kw):
        raise OSError("disk full")

    monkeypatch.setattr(prefix_file.os, "fsync", boom)
    k = [torch.zeros(10, HEADS, DIM) for _ in range(LAYERS)]
    with pytest.raises(OSError):
        write_prefix_file(path, _fp(), _nodes(), k, k)
    assert open(path, "rb").read() == before
    assert os.listdir(tmp_path) == ["f.rsp"]


def _kv_with(prompts: list[tuple[list[int], str | None]], num_slots: int = 64) -> KVManager:
    kv = KVManager(num_slots, 4, 128)
    for ids, salt in prompts:
        slots = kv._allocator.alloc(len(ids))
        already = kv._cache.insert(ids, slots, salt)
        kv._allocator.free(slots[:already])
    return kv


def test_select_hot_is_parent_first_and_within_budget():
    kv = _kv_with([([1, 2, 3, 4, 5, 6], None), ([1, 2, 3, 9, 9], None), ([7, 7, 7], "s"), ([8, 8], None)])
    cache = kv._cache
    cache.match_prefix([1, 2, 3, 9, 9])  # the most recent: taken first
    nodes, slots = select_hot(cache.root, 100)
    assert sum(len(n.tokens) for n in nodes) == len(slots) == 6 + 2 + 3 + 2
    for i, n in enumerate(nodes):
        assert n.parent < i
        if n.parent >= 0:
            assert nodes[n.parent].salt == n.salt
    assert nodes[0].tokens.tolist() == [1, 2, 3] and nodes[1].tokens.tolist() == [9, 9]
    assert {n.salt for n in nodes} == {None, "s"}
    nodes, slots = select_hot(cache.root, 4)  # cut short: a path prefix, nothing below the cut
    assert [n.tokens.tolist() for n in nodes] == [[1, 2, 3], [9]] and len(slots) == 4


def test_select_hot_prefers_hit_count():
    kv = _kv_with([([1, 2], None), ([3, 4], None)])
    cache = kv._cache
    cache.match_prefix([3, 4])
    node12 = cache.root.children[1]
    if not hasattr(node12, "hit_count"):
        pytest.skip("TreeNode has no hit_count here (added by the cache inspector)")
    node12.hit_count = 5
    nodes, _ = select_hot(cache.root, 2)
    assert nodes[0].tokens.tolist() == [1, 2]


def _store(tmp_path, num_slots: int = 64, dtype=torch.float32) -> PrefixStore:
    pool = KVPool(num_slots, LAYERS, HEADS, DIM, dtype)
    for b in pool.k_buffer + pool.v_buffer:
        b.copy_(torch.randn_like(b.float()).to(dtype))
    return PrefixStore(pool, _fp(str(dtype)[6:]), str(tmp_path))


def test_save_restore_through_the_persister(tmp_path):
    """Save a tree, restore it into a fresh manager + pool: same paths, same KV, invariants hold."""
    kv = _kv_with([([1, 2, 3, 4, 5, 6], None), ([1, 2, 3, 9, 9], None), ([7, 7, 7], "s")])
    store = _store(tmp_path)
    cfg = CacheConfig(cache_persist_dir=str(tmp_path))
    per_slot = KVPool.bytes_per_slot(LAYERS, HEADS, DIM, torch.float32)
    assert CachePersister(kv, store, cfg, per_slot).save(wait=True).ok
    kv2, store2 = KVManager(64, 4, 128), _store(tmp_path)
    p2 = CachePersister(kv2, store2, cfg, per_slot)
    reply = p2.restore()
    assert reply.used == p2.restored_tokens == 11
    kv2.check_invariants()
    hot = [(n.parent, n.salt, n.tokens.tolist()) for n in select_hot(kv._cache.root, 100)[0]]
    assert [(n.parent, n.salt, n.tokens.tolist()) for n in select_hot(kv2._cache.root, 100)[0]] == hot
    for ids, salt in (([1, 2, 3, 4, 5, 6], None), ([1, 2, 3, 9, 9], None), ([7, 7, 7], "s")):
        old, _ = kv._cache.match_prefix(ids, salt)
        new, _ = kv2._cache.match_prefix(ids, salt)
        assert len(new) == len(ids)
        for a, b in ((store.pool.k_buffer, store2.pool.k_buffer), (store.pool.v_buffer, store2.pool.v_buffer)):
            for la, lb in zip(a, b):
                assert torch.equal(la[old], lb[new])
    assert kv2._cache.match_prefix([7, 7, 7])[0].size == 0  # the salted path stays in its namespace
    assert kv2.available() == 63 and kv2._cache.evictable_size == 11  # unlocked, evictable


def test_restore_respects_room_and_budget(tmp_path):
    kv = _kv_with([([1, 2, 3, 4, 5, 6], None), ([1, 2, 3, 9, 9], None), ([7, 7, 7], "s")])
    store = _store(tmp_path)
    cfg = CacheConfig(cache_persist_dir=str(tmp_path))
    per_slot = KVPool.bytes_per_slot(LAYERS, HEADS, DIM, torch.float32)
    CachePersister(kv, store, cfg, per_slot).save(wait=True)
    kv2 = KVManager(12, 4, 128)  # 11 usable slots: restore takes at most half the free pool
    p2 = CachePersister(kv2, _store(tmp_path, 12), cfg, per_slot)
    assert p2.restore().used == 5
    kv2.check_invariants()
    assert kv2.free_slots() == 11 - 5
    small = CacheConfig(cache_persist_dir=str(tmp_path), cache_persist_max_bytes=2 * per_slot)
    kv3 = KVManager(64, 4, 128)
    assert CachePersister(kv3, _store(tmp_path), small, per_slot).restore().used == 2
    kv3.check_invariants()


@pytest.mark.parametrize("problem", ["dtype", "corrupt", "missing"])
def test_store_skips_bad_files(tmp_path, caplog, problem):
    store = _store(tmp_path)
    store.save_prefixes(KVSaveReq(_nodes(), np.arange(1, 11), wait=True))
    path = os.path.join(tmp_path, FILE_NAME)
    if problem == "dtype":
        store = _store(tmp_path, dtype=torch.bfloat16)
    elif problem == "corrupt":
        data = bytearray(open(path, "rb").read())
        data[-40] ^= 0x10
        open(path, "wb").write(bytes(data))
    else:
        os.unlink(path)
    caplog.set_level("WARNING")
    reply = store.restore_prefixes(KVRestoreReq(np.arange(1, 30)))
    assert reply.used == 0 and reply.nodes == []
    if problem != "missing":
        assert "skipping the prefix file" in caplog.text
        assert ("dtype" if problem == "dtype" else "checksum") in reply.message


def test_background_save_is_complete(tmp_path):
    store = _store(tmp_path)
    reply = store.save_prefixes(KVSaveReq(_nodes(), np.arange(1, 11)))
    assert reply.ok and reply.num_tokens == 10
    store.close()
    assert read_prefix_file(os.path.join(tmp_path, FILE_NAME)).num_tokens == 10
    assert sorted(os.listdir(tmp_path)) == [FILE_NAME]


def test_config_rejects_negative_values():
    with pytest.raises(ValueError, match="cache_persist_interval"):
        CacheConfig(cache_persist_interval=-1)
    with pytest.raises(ValueError, match="cache_persist_max_bytes"):
        CacheConfig(cache_persist_max_bytes=-1)


class _CountingLink:
    def __init__(self, store: PrefixStore) -> None:
        self.store, self.saves = store, 0

    def save_prefixes(self, req):
        self.saves += 1
        return self.store.save_prefixes(req)

    def restore_prefixes(self, req):
        return self.store.restore_prefixes(req)


def test_interval_writer_saves_when_due_and_changed(tmp_path):
    kv = _kv_with([([1, 2, 3], None)])
    link = _CountingLink(_store(tmp_path))
    now = [0.0]
    per_slot = KVPool.bytes_per_slot(LAYERS, HEADS, DIM, torch.float32)
    p = CachePersister(kv, link, CacheConfig(cache_persist_dir=str(tmp_path), cache_persist_interval=10), per_slot,
                       clock=lambda: now[0])
    assert p.maybe_save() is None and link.saves == 0  # not due yet
    now[0] = 10.0
    assert p.maybe_save().ok and link.saves == 1
    link.store.close()
    now[0] = 25.0
    assert p.maybe_save() is None and link.saves == 1  # due, but nothing changed
    slots = kv._allocator.alloc(2)
    kv._cache.insert([5, 6], slots)
    now[0] = 40.0
    assert p.maybe_save().ok and link.saves == 2
    link.store.close()
    assert read_prefix_file(os.path.join(tmp_path, FILE_NAME)).num_tokens == 5


def test_no_persistence_without_a_prefix_cache(tmp_path):
    cfg = CacheConfig(cache_persist_dir=str(tmp_path), disable_radix_cache=True)
    assert not cfg.persists and CacheConfig(cache_persist_dir=str(tmp_path)).persists
    kv = KVManager(16, 4, 128, disable_radix_cache=True)
    nodes, slots = kv.hot_prefixes(100)
    assert nodes == [] and len(slots) == 0 and len(kv.reserve_for_restore(8)) == 0
