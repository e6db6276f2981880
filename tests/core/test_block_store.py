"""The disk tier's block files: written on the writer thread, read back (ahead or on demand)
only when intact and written for this model."""
from __future__ import annotations

import os

import numpy as np
import torch

from radixserve.worker.tiers.block_store import BlockStore, remove_stale

FP = {"model": "m", "dtype": "float32", "num_layers": 3, "num_kv_heads": 2, "head_dim": 8}


def rows(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, 2, 8, generator=g) for _ in range(3)], [torch.randn(n, 2, 8, generator=g) for _ in range(3)]


def test_write_read_ahead_and_faults(tmp_path):
    store = BlockStore(str(tmp_path), FP)
    k, v = rows(10, 0)
    store.write("b0", np.arange(10), None, (k, v))
    got = store.read("b0", 2, 5)  # still queued or written: served either way
    assert all(torch.equal(a, b[2:7]) for a, b in zip(got[0], k))
    store.write("b1", np.arange(10), "salt", rows(10, 1))
    store.flush()
    assert sorted(os.listdir(store.folder)) == ["b0.rsp", "b1.rsp"]
    store.prefetch("b0")
    got = store.read("b0", 0, 10)
    assert all(torch.equal(a, b) for a, b in zip(got[1], v))
    assert store.read("b0", 5, 6) is None  # more rows than the block has
    with open(store.path("b1"), "r+b") as f:
        f.seek(100)
        f.write(b"\xff" * 8)
    assert store.read("b1", 0, 1) is None  # checksum
    other = BlockStore(str(tmp_path), {**FP, "model": "other"})
    os.replace(store.path("b0"), other.path("b0"))
    assert other.read("b0", 0, 1) is None  # another model's fingerprint
    store.drop("b1")
    assert not os.path.exists(store.path("b1"))
    store.close()
    other.close()
    assert not os.listdir(tmp_path)


def test_failed_writes_are_reported_and_stale_folders_removed(tmp_path):
    stale = tmp_path / "radixserve-hicache-999999999-deadbeef"
    stale.mkdir()
    remove_stale(str(tmp_path))
    assert not stale.exists()
    store = BlockStore(str(tmp_path), FP)
    os.rmdir(store.folder)
    os.symlink("/proc/version", store.folder)  # a path the writer cannot make a folder at
    store.write("b0", np.arange(4), None, rows(4, 2))
    store.flush()
    assert store.lost() == ["b0"] and store.lost() == []
    os.unlink(store.folder)
    store.write("b1", np.arange(4), None, rows(4, 3))  # the folder is made again
    store.flush()
    assert store.read("b1", 0, 4) is not None
    store.close()
