"""Prefix-cache counters over time windows, for the inspector's ``/cache/stats``.

``CacheStats`` keeps one bucket per second for the last ``HORIZON_S`` seconds plus totals since
start: prompt tokens queried, of which cached (hits), admitted requests, evicted nodes and
tokens.  A window's hit rate is cached prompt tokens / prompt tokens over the window (None
with no traffic).  Single-threaded (the scheduler thread, like the cache that owns it);
O(1) per event, O(buckets) per ``snapshot``.
"""
from __future__ import annotations

import time
from collections import deque
from typing import Any, Callable, Optional

WINDOWS_S = {"last_1m": 60, "last_5m": 300}
HORIZON_S = max(WINDOWS_S.values())
_FIELDS = ("prompt_tokens", "cached_tokens", "requests", "evicted_nodes", "evicted_tokens")


class CacheStats:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.started = clock()
        self.totals = dict.fromkeys(_FIELDS, 0)
        self._buckets: deque[list[int]] = deque()  # [second, *counts in _FIELDS order], oldest first

    def _add(self, counts: dict[str, int]) -> None:
        sec = int(self.clock())
        if not self._buckets or self._buckets[-1][0] != sec:
            self._buckets.append([sec] + [0] * len(_FIELDS))
            while self._buckets[0][0] <= sec - HORIZON_S:
                self._buckets.popleft()
        bucket = self._buckets[-1]
        for name, n in counts.items():
            i = _FIELDS.index(name)
            bucket[i + 1] += n
            self.totals[name] += n

    def record_hit(self, matched: int, total: int) -> None:
        """A first admission: ``matched`` of its ``total`` prompt tokens came from the cache."""
        self._add({"prompt_tokens": total, "cached_tokens": matched, "requests": 1})

    def record_eviction(self, nodes: int, tokens: int) -> None:
        if nodes or tokens:
            self._add({"evicted_nodes": nodes, "evicted_tokens": tokens})

    def window(self, seconds: int, now: Optional[float] = None) -> dict[str, Any]:
        """The counts of the last ``seconds`` seconds (the current second included)."""
        since = int(self.clock() if now is None else now) - seconds
        sums = [0] * len(_FIELDS)
        for bucket in reversed(self._buckets):
            if bucket[0] <= since:
                break
            for i in range(len(_FIELDS)):
                sums[i] += bucket[i + 1]
        return _with_rate(dict(zip(_FIELDS, sums)))

    def snapshot(self) -> dict[str, Any]:
        """``{"windows": {"last_1m": counts, "last_5m": counts, "since_start": counts}, "uptime_s": ...}``; each
        ``counts`` has every counter plus ``hit_rate`` (None when no prompt token was queried)."""
        now = self.clock()
        windows = {name: self.window(s, now) for name, s in WINDOWS_S.items()}
        windows["since_start"] = _with_rate(dict(self.totals))
        return {"windows": windows, "uptime_s": now - self.started}


def _with_rate(counts: dict[str, Any]) -> dict[str, Any]:
    counts["hit_rate"] = counts["cached_tokens"] / counts["prompt_tokens"] if counts["prompt_tokens"] else None
    return counts
