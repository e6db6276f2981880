"""The host tier's KV buffers and the moves of ``KVTierReq`` (``ipc/tier_link.py``).

``TierStore`` holds, for each KV pool of the worker (the model's, and a draft model's when
speculative decoding runs one), per-layer host buffers of ``host_slots`` token rows in the
pool's dtype or quantized (``kv_codec.py``; pinned memory on CUDA).  The disk tier (``BlockStore``) keeps the model's pool
only: a draft model's KV of a prefix loaded from disk is stale, which costs acceptance, not
correctness (the target verifies every token).

Contract: ``apply_tiers`` runs on the worker's thread between steps and carries the moves out
in order; when it returns, every source slot may be reused.  It never raises for a block: a
block that cannot be read is a failed move (its destination slots hold nothing usable).
"""
from __future__ import annotations

import logging
from typing import Optional, Sequence

import numpy as np
import torch

from radixserve.ipc.tier_link import KVTierReply, KVTierReq, TierMove
from radixserve.mem_cache.kv_pool import KVPool
from radixserve.worker.tiers.block_store import BlockStore
from radixserve.worker.tiers.kv_codec import HostRows

logger = logging.getLogger(__name__)


def _idx(a: Optional[np.ndarray], device: torch.device) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)).to(device)


def host_slot_bytes(pools: Sequence[KVPool], kind: str = "auto") -> int:
    """Bytes a token takes in the host tier over every pool (K and V of every layer)."""
    return sum(p.num_layers * (1 if p.shared_kv else 2) *
               HostRows.slot_bytes(p.num_kv_heads, p.row_width, p.store_dtype, "auto" if p.quant else kind)
               for p in pools)


class TierStore:
    def __init__(self, pools: Sequence[KVPool], host_slots: int, blocks: Optional[BlockStore] = None,
                 kind: str = "auto") -> None:
        """``kind``: how the host tier stores KV (``kv_codec.py``: "auto" exact, or quantized)."""
        self.pools, self.blocks, self.host_slots, self.kind = list(pools), blocks, host_slots, kind
        self.host_k: list[list[HostRows]] = []
        self.host_v: list[list[HostRows]] = []
        for pool in self.pools:
            pin = pool.device.type == "cuda"

            def rows() -> HostRows:
                # a packed pool's rows are kept as they are (codes and scales)
                return HostRows(host_slots, pool.num_kv_heads, pool.row_width, pool.store_dtype,
                                "auto" if pool.quant else kind, pin)

            k = [rows() for _ in range(pool.num_layers)]
            self.host_k.append(k)
            self.host_v.append(k if pool.shared_kv else [rows() for _ in range(pool.num_layers)])

    @property
    def host_bytes(self) -> int:
        """Bytes of every host buffer."""
        return host_slot_bytes(self.pools, self.kind) * self.host_slots

    def apply_tiers(self, req: KVTierReq) -> KVTierReply:
        failed = []
        for i, move in enumerate(req.moves):
            try:
                ok = self._apply(move)
            except Exception as e:  # noqa: BLE001 - a bad move fails alone, the worker keeps serving
                logger.error("hierarchical cache: %s move failed: %s: %s", move.kind, type(e).__name__, e)
                ok = False
            if not ok:
                failed.append(i)
        lost = self.blocks.lost() if self.blocks is not None else []
        return KVTierReply(failed, lost)

    def _apply(self, m: TierMove) -> bool:
        if m.kind == "pool_to_host":
            for pool, hk, hv in zip(self.pools, self.host_k, self.host_v):
                src, dst = _idx(m.src, pool.device), _idx(m.dst, torch.device("cpu"))
                for layer in range(pool.num_layers):
                    hk[layer].put(dst, pool.k_buffer[layer].index_select(0, src).cpu())
                    if not pool.shared_kv:
                        hv[layer].put(dst, pool.v_buffer[layer].index_select(0, src).cpu())
            return True
        if m.kind == "host_to_pool":
            for pool, hk, hv in zip(self.pools, self.host_k, self.host_v):
                src, dst = _idx(m.src, torch.device("cpu")), _idx(m.dst, pool.device)
                for layer in range(pool.num_layers):
                    pool.k_buffer[layer].index_copy_(0, dst, hk[layer].get(src).to(pool.device))
                    if not pool.shared_kv:
                        pool.v_buffer[layer].index_copy_(0, dst, hv[layer].get(src).to(pool.device))
            return True
        if self.blocks is None:
            return False
        if m.kind == "host_to_disk":
            src = _idx(m.src, torch.device("cpu"))
            k = [t.get(src) for t in self.host_k[0]]  # blocks hold the pool's rows (dequantized from the host form)
            v = [t.get(src) for t in self.host_v[0]]
            self.blocks.write(m.block, np.asarray(m.tokens, dtype=np.int64), m.salt, (k, v))
            return True
        if m.kind == "disk_to_pool":
            pool, n = self.pools[0], len(m.dst)
            rows = self.blocks.read(m.block, m.offset, n)
            if rows is None:
                return False
            dst = _idx(m.dst, pool.device)
            for layer in range(pool.num_layers):
                pool.k_buffer[layer].index_copy_(0, dst, rows[0][layer].to(pool.device, pool.store_dtype))
                if not pool.shared_kv:
                    pool.v_buffer[layer].index_copy_(0, dst, rows[1][layer].to(pool.device, pool.store_dtype))
            return True
        if m.kind == "drop_block":
            self.blocks.drop(m.block)
            return True
        if m.kind == "prefetch_block":
            self.blocks.prefetch(m.block)
            return True
        raise ValueError(f"unknown tier move {m.kind!r}")

    def close(self) -> None:
        if self.blocks is not None:
            self.blocks.close()
