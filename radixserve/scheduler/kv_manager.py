"""Moves KV slots between the allocator, the radix tree and running requests.

Every slot is in exactly one of three states: free in the allocator, owned by one radix
node, or held by one running request (``row[cached_len:kv_len]``).
"""
from __future__ import annotations

from typing import Optional

import torch

from radixserve.mem_cache.allocator import SlotAllocator
from radixserve.mem_cache.radix_cache import RadixCache, TreeNode
from radixserve.mem_cache.req_to_token import ReqToTokenPool
from radixserve.scheduler.req import Req


class KVManager:
    def __init__(self, num_slots: int, max_rows: int, max_context_len: int, disable_radix_cache: bool) -> None:
        self.allocator = SlotAllocator(num_slots)
        self.cache = RadixCache(self.allocator.free, disable=disable_radix_cache)
        self.req_to_token = ReqToTokenPool(max_rows, max_context_len)

    @property
    def capacity(self) -> int:
        return self.allocator.num_slots - 1

    def available(self) -> int:
        """Slots obtainable now: free ones plus unlocked cached ones."""
        return self.allocator.available_size() + self.cache.evictable_size

    def alloc_slots(self, n: int) -> Optional[torch.Tensor]:
        short = n - self.allocator.available_size()
        if short > 0:
            self.cache.evict(short)
        return self.allocator.alloc(n)

    def row(self, req: Req) -> torch.Tensor:
        return self.req_to_token.table[req.row]

    # ------------------------------------------------------------------ admission
    def admit(self, req: Req, prefix: torch.Tensor, node: TreeNode, new_slots: torch.Tensor) -> None:
        """Give ``req`` a row holding the cached ``prefix`` (locked via ``node``) followed by
        ``new_slots``.  The caller locked ``node`` already."""
        row = self.req_to_token.alloc()
        assert row is not None, "request rows exhausted (max_running_requests)"
        req.row, req.last_node = row, node
        req.kv_len = req.cached_len = len(prefix)
        table = self.req_to_token.table
        table[row, : len(prefix)] = prefix.to(torch.int32)
        table[row, len(prefix): len(prefix) + len(new_slots)] = new_slots.to(torch.int32)

    def extend_row(self, req: Req, new_slots: torch.Tensor) -> None:
        self.req_to_token.table[req.row, req.kv_len: req.kv_len + len(new_slots)] = new_slots.to(torch.int32)

    # ------------------------------------------------------------------ caching
    def cache_unfinished(self, req: Req) -> bool:
        """Insert the computed tokens into the tree and move the lock to the new node.
        Returns True when the row was rewritten (duplicates replaced by tree slots), in
        which case the worker's copy of the row must be resent."""
        if self.cache.disable or req.kv_len <= req.cached_len:
            return False
        keys = req.fill_ids[: req.kv_len]
        row = self.req_to_token.table[req.row]
        already = self.cache.insert(keys, row[: req.kv_len].long())
        rewritten = already > req.cached_len
        if rewritten:
            self.allocator.free(row[req.cached_len: already].long().clone())
        slots, node = self.cache.match_prefix(keys)
        assert len(slots) == req.kv_len
        if rewritten:
            row[: req.kv_len] = slots.to(torch.int32)
        self.cache.inc_lock_ref(node)
        self.cache.dec_lock_ref(req.last_node)
        req.last_node, req.cached_len = node, req.kv_len
        return rewritten

    def release(self, req: Req) -> None:
        """Hand the request's computed KV to the tree (or free it) and drop its row."""
        row = self.req_to_token.table[req.row]
        if self.cache.disable:
            self.allocator.free(row[req.cached_len: req.kv_len].long().clone())
        else:
            already = self.cache.insert(req.fill_ids[: req.kv_len], row[: req.kv_len].long())
            if already > req.cached_len:
                self.allocator.free(row[req.cached_len: already].long().clone())
            self.cache.dec_lock_ref(req.last_node)
        self.req_to_token.free(req.row)
        req.row, req.last_node, req.kv_len, req.cached_len = None, None, 0, 0
        req.on_worker = False

    def free_request_tail(self, req: Req, n: int) -> None:
        """Return slots allocated for ``n`` positions after ``kv_len`` that were never used."""
        row = self.req_to_token.table[req.row]
        self.allocator.free(row[req.kv_len: req.kv_len + n].long().clone())
