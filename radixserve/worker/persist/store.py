"""The worker side of warm restart: copies KV between the pool and the prefix file.

Contract: ``save_prefixes`` and ``restore_prefixes`` run on the worker's thread between steps (never during
one).  ``save_prefixes`` copies the KV of the requested slots out of the pool before it returns, so the
scheduler may reuse those slots at once; the file is written on a background thread (one at a
time: a save that finds the previous write still running is refused) unless the request says
``wait``.  ``restore_prefixes`` writes KV only into the slots the scheduler reserved for it and never
raises for a bad file: a missing, corrupt, truncated or mismatched file (another model, dtype,
quantization or KV layout) is skipped with a warning and nothing is loaded.
"""
from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import threading
import time
from typing import Any, Optional

import numpy as np
import torch

from radixserve.ipc.persist_link import KVRestoreReply, KVRestoreReq, KVSaveReply, KVSaveReq, PersistNode
from radixserve.mem_cache.kv_pool import KVPool
from radixserve.worker.persist.file_format import PrefixFileError, read_prefix_file, write_prefix_file

logger = logging.getLogger(__name__)

FILE_NAME = "prefix_cache.rsp"
_SAMPLE = 1 << 20
_CONFIG_NOISE = ("_name_or_path", "transformers_version")  # differ between copies of one model


def _weights_identity(hf_dir: str) -> list[list[Any]]:
    """(name, size, sha256 of up to three 1 MiB samples: start, middle, end) of each weights file:
    cheap, yet any retrained or re-quantized copy of the same architecture differs."""
    out = []
    for path in sorted(glob.glob(os.path.join(hf_dir, "*.safetensors")) + glob.glob(os.path.join(hf_dir, "*.bin"))):
        size, h = os.path.getsize(path), hashlib.sha256()
        with open(path, "rb") as f:
            for at in sorted({0, max(0, size // 2 - _SAMPLE // 2), max(0, size - _SAMPLE)}):
                f.seek(at)
                h.update(f.read(_SAMPLE))
        out.append([os.path.basename(path), size, h.hexdigest()])
    return out


def fingerprint(config: Any, hf_dir: str, pool: KVPool, quantization: str, page_size: int) -> dict[str, Any]:
    """What must match for a file's KV to be valid in this worker (compared as a whole)."""
    cfg = {k: v for k, v in config.to_dict().items() if k not in _CONFIG_NOISE}
    fp = {"config_sha256": hashlib.sha256(json.dumps(cfg, sort_keys=True, default=str).encode()).hexdigest(),
          "weights": _weights_identity(hf_dir), "dtype": str(pool.store_dtype).removeprefix("torch."),
          "quantization": quantization, "num_layers": pool.num_layers, "num_kv_heads": pool.num_kv_heads,
          "head_dim": pool.row_width, "page_size": page_size}
    if pool.quant:  # the file's rows are the pool's packed rows (dtype uint8, head_dim + 4 bytes each)
        fp["kv_cache_dtype"] = pool.quant
        fp["kv_dtype"] = str(pool.dtype).removeprefix("torch.")
    return fp


class PrefixStore:
    def __init__(self, pool: KVPool, fp: dict[str, Any], folder: str) -> None:
        os.makedirs(folder, exist_ok=True)
        for stale in glob.glob(os.path.join(folder, ".tmp-*")):  # a write cut short by a crash or SIGKILL
            os.unlink(stale)
        self.pool, self.fp = pool, fp
        self.path = os.path.join(folder, FILE_NAME)
        self._writer: Optional[threading.Thread] = None

    # ------------------------------------------------------------------ save
    def save_prefixes(self, req: KVSaveReq) -> KVSaveReply:
        if self._writer is not None and self._writer.is_alive():
            if not req.wait:
                return KVSaveReply(False, "the previous write is still running")
            self._writer.join()
        idx = torch.from_numpy(np.ascontiguousarray(req.slots, dtype=np.int64)).to(self.pool.device)
        k = [b.index_select(0, idx).cpu() for b in self.pool.k_buffer]
        v = [b.index_select(0, idx).cpu() for b in self.pool.v_buffer]
        n = int(idx.numel())
        nbytes = n * self.pool.slot_bytes
        if req.wait:
            ok = self._write(req.nodes, k, v)
            return KVSaveReply(ok, "" if ok else "write failed (see the worker's log)", n, nbytes)
        self._writer = threading.Thread(target=self._write, args=(req.nodes, k, v), name="prefix-writer",
                                        daemon=True)
        self._writer.start()
        return KVSaveReply(True, "writing", n, nbytes)

    def _write(self, nodes: list[PersistNode], k: list[torch.Tensor], v: list[torch.Tensor]) -> bool:
        t0 = time.perf_counter()
        try:
            size = write_prefix_file(self.path, self.fp, nodes, k, v)
        except OSError as e:
            logger.error("could not write the prefix cache to %s: %s", self.path, e)
            return False
        logger.info("persisted %d cached tokens (%d nodes, %.1f MiB) to %s in %.2fs",
                    sum(len(x.tokens) for x in nodes), len(nodes), size / 2**20, self.path, time.perf_counter() - t0)
        return True

    def close(self) -> None:
        """Wait for a background write to finish."""
        if self._writer is not None:
            self._writer.join()

    # ------------------------------------------------------------------ restore
    def restore_prefixes(self, req: KVRestoreReq) -> KVRestoreReply:
        if not os.path.exists(self.path):
            return KVRestoreReply(message=f"no prefix file at {self.path}")
        t0 = time.perf_counter()
        try:
            f = read_prefix_file(self.path)
        except (PrefixFileError, OSError) as e:
            logger.warning("skipping the prefix file %s: %s", self.path, e)
            return KVRestoreReply(message=f"skipped: {e}")
        if f.fingerprint != self.fp:
            diff = sorted(k for k in self.fp.keys() | f.fingerprint.keys() if f.fingerprint.get(k) != self.fp.get(k))
            logger.warning("skipping the prefix file %s: written for another model or numerics (differs in %s)",
                           self.path, ", ".join(diff))
            return KVRestoreReply(message=f"skipped: fingerprint differs in {', '.join(diff)}")
        nodes, positions = self._fit(f.nodes, len(req.slots))
        used = len(positions)
        if used:
            src = torch.from_numpy(np.asarray(positions, dtype=np.int64))
            dst = torch.from_numpy(np.ascontiguousarray(req.slots[:used], dtype=np.int64)).to(self.pool.device)
            for layer in range(self.pool.num_layers):
                self.pool.k_buffer[layer].index_copy_(0, dst, f.k[layer].index_select(0, src).to(self.pool.device))
                self.pool.v_buffer[layer].index_copy_(0, dst, f.v[layer].index_select(0, src).to(self.pool.device))
        msg = (f"loaded {used} of {f.num_tokens} persisted tokens ({len(nodes)} nodes) in "
               f"{time.perf_counter() - t0:.2f}s")
        logger.info("%s from %s", msg, self.path)
        return KVRestoreReply(nodes, used, msg)

    @staticmethod
    def _fit(nodes: list[PersistNode], room: int) -> tuple[list[PersistNode], list[int]]:
        """The file's nodes that fit in ``room`` slots, parents first (a node cut short keeps
        its leading tokens and loses its children), re-indexed, and the file positions of
        their tokens.  A node whose salt differs from its parent's is dropped with its subtree."""
        kept: list[PersistNode] = []
        new_index: dict[int, int] = {}
        whole: set[int] = set()  # file indices kept in full (may have children)
        positions: list[int] = []
        at = 0
        for i, node in enumerate(nodes):
            n = len(node.tokens)
            start, at = at, at + n
            parent_ok = node.parent == -1 or (node.parent in whole and nodes[node.parent].salt == node.salt)
            take = min(n, room - len(positions))
            if not parent_ok or take <= 0:
                continue
            new_index[i] = len(kept)
            kept.append(PersistNode(new_index.get(node.parent, -1), node.salt, node.tokens[:take]))
            positions.extend(range(start, start + take))
            if take == n:
                whole.add(i)
        return kept, positions
