"""Waiting-queue ordering: priority, then longest prefix match with a wait bound, or FCFS.

Contract: ``order_waiting`` only reorders (every waiting request appears once) and is a pure
function of the requests, their cached-prefix lengths and ``now``; with equal priorities
and no request past the wait bound it is the plain LPM (or FCFS) order.
"""
from __future__ import annotations

from typing import Optional, Protocol

import numpy as np

from radixserve.mem_cache.radix_cache import RadixCache
from radixserve.scheduler.req import Req

POLICIES = ("lpm", "fcfs")


class PrefixLengths(Protocol):
    def match_len(self, req: Req) -> int:
        """How many leading tokens of ``req`` are cached (``KVManager.match_len``)."""
        ...


def order_waiting(waiting: list[Req], kv: PrefixLengths, policy: str, lpm_queue_limit: int,
                  max_queue_wait_s: float = 0.0, now: Optional[float] = None) -> list[Req]:
    """Return the waiting requests in admission order.

    Higher ``sampling.priority`` first (a stable sort: equal priorities keep the order below).
    ``lpm`` sorts by the length of the cached prefix (longest first, FCFS among equals), except
    that requests that have waited ``max_queue_wait_s`` or more (``now - arrival``; <= 0 or
    ``now`` None: never) go first, oldest first: so LPM passes a request over for at most
    that long.  Past ``lpm_queue_limit`` waiting requests the tree walks cost more than they
    save, so it falls back to FCFS, as SGLang does.  Without a prefix cache every length is
    0, so ``lpm`` keeps the FCFS order.
    """
    if policy not in POLICIES:
        raise ValueError(f"schedule_policy: unknown policy {policy!r} (lpm|fcfs)")
    if policy == "fcfs" or len(waiting) > lpm_queue_limit:
        order = list(waiting)
    else:
        order = _lpm(waiting, kv, max_queue_wait_s, now)
    order.sort(key=lambda r: -r.sampling.priority)
    return order


def _lpm(waiting: list[Req], kv: PrefixLengths, max_queue_wait_s: float, now: Optional[float]) -> list[Req]:
    bounded = max_queue_wait_s > 0 and now is not None
    overdue, fresh = [], []
    for i, req in enumerate(waiting):
        if bounded and req.arrival is not None and now - req.arrival >= max_queue_wait_s:
            overdue.append((req.arrival, i, req))
        else:
            fresh.append((-kv.match_len(req), i, req))
    overdue.sort(key=lambda t: (t[0], t[1]))
    fresh.sort(key=lambda t: (t[0], t[1]))
    return [r for _, _, r in overdue] + [r for _, _, r in fresh]


class InBatchPrefixFilter:
    """Defers a request whose uncached tokens share a long prefix with a request admitted
    earlier in the same round: once that one is prefilled, this one hits the cache."""

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        self.tree = RadixCache(free_fn=lambda _: None)

    def should_defer(self, tokens: list[int], cached_len: int, salt: Optional[str] = None) -> bool:
        """True when a request admitted this round (under the same cache ``salt``) will compute
        at least ``threshold`` of this request's not-yet-cached tokens, or the very same tokens
        (n > 1 copies)."""
        if self.threshold <= 0 or len(tokens) == cached_len:
            return False
        matched, _ = self.tree.match_prefix(tokens, salt)
        return len(matched) - cached_len >= self.threshold or len(matched) == len(tokens)

    def add(self, tokens: list[int], salt: Optional[str] = None) -> None:
        if self.threshold > 0:
            self.tree.insert(tokens, np.zeros(len(tokens), dtype=np.int64), salt)
