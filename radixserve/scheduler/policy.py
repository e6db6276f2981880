"""Waiting-queue ordering: longest prefix match (falling back to FCFS) or FCFS."""
from __future__ import annotations

from typing import Protocol

import torch

from radixserve.mem_cache.radix_cache import RadixCache
from radixserve.scheduler.req import Req


class PrefixLengths(Protocol):
    def match_len(self, req: Req) -> int:
        """How many leading tokens of ``req`` are cached (``KVManager.match_len``)."""
        ...


def order_waiting(waiting: list[Req], kv: PrefixLengths, policy: str, lpm_queue_limit: int) -> list[Req]:
    """Return the waiting requests in admission order.

    ``lpm`` sorts by the length of the cached prefix (longest first, FCFS among equals);
    past ``lpm_queue_limit`` waiting requests the tree walks cost more than they save, so
    it falls back to FCFS, as SGLang does.  Without a prefix cache every length is 0, so
    ``lpm`` keeps the FCFS order.
    """
    if policy == "fcfs" or len(waiting) > lpm_queue_limit:
        return list(waiting)
    if policy != "lpm":
        raise ValueError(f"schedule_policy: unknown policy {policy!r} (lpm|fcfs)")
    scored = []
    for i, req in enumerate(waiting):
        scored.append((-kv.match_len(req), i, req))
    scored.sort(key=lambda t: (t[0], t[1]))
    return [r for _, _, r in scored]


class InBatchPrefixFilter:
    """Defers a request whose uncached tokens share a long prefix with a request admitted
    earlier in the same round: once that one is prefilled, this one hits the cache."""

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        self.tree = RadixCache(free_fn=lambda _: None)

    def should_defer(self, tokens: list[int], cached_len: int) -> bool:
        """True when a request admitted this round will compute at least ``threshold`` of
        this request's not-yet-cached tokens, or the very same tokens (n > 1 copies)."""
        if self.threshold <= 0 or len(tokens) == cached_len:
            return False
        matched, _ = self.tree.match_prefix(tokens)
        return len(matched) - cached_len >= self.threshold or len(matched) == len(tokens)

    def add(self, tokens: list[int]) -> None:
        if self.threshold > 0:
            self.tree.insert(tokens, torch.zeros(len(tokens), dtype=torch.int64))
