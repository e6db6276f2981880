"""Per-key token budgets and request rates: admission with reservations, charge at the end.

Budget = prompt + completion tokens per UTC calendar period (``keys.PERIODS``).  Admission
reserves a request's worst case (its prompt tokens plus ``max_new_tokens`` of every
sequence) and is refused when the period's charged tokens plus every reservation in flight
plus this one would pass the budget; so concurrent requests of one key never spend more
than the budget (a sequence never uses more than it reserved).  At the end the reservation
is dropped and the actual usage charged (``settle``), in the period current then.  A
refused request reserves and charges nothing.  ``requests_per_minute`` counts admitted
requests in a sliding 60 s window.  Event-loop thread only (no locking).
"""
from __future__ import annotations

import calendar
import math
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Iterable

from radixserve.server.tenancy.keys import KeySpec
from radixserve.server.tenancy.usage_db import UsageDB, iso

RECORDED_PERIODS = ("day", "month")  # always recorded, besides each key's own period


def period_bounds(period: str, now: float) -> tuple[float, float]:
    """(start, end) epoch seconds of the UTC calendar ``period`` holding ``now``."""
    t = datetime.fromtimestamp(now, timezone.utc)
    if period == "minute":
        start = t.replace(second=0, microsecond=0)
    elif period == "hour":
        start = t.replace(minute=0, second=0, microsecond=0)
    elif period == "day":
        start = t.replace(hour=0, minute=0, second=0, microsecond=0)
    elif period == "month":
        start = t.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    else:
        raise ValueError(f"period: unknown {period!r}")
    s = start.timestamp()
    if period == "month":
        return s, s + 86400 * calendar.monthrange(start.year, start.month)[1]
    return s, s + {"minute": 60, "hour": 3600, "day": 86400}[period]


class LimitExceeded(Exception):
    """Admission refused: a 429 with ``message`` and ``Retry-After: retry_after``."""

    def __init__(self, message: str, retry_after: int, reason: str) -> None:
        super().__init__(message)
        self.message, self.retry_after, self.reason = message, retry_after, reason


@dataclass
class KeyState:
    period: str = ""
    start: float = 0.0
    end: float = 0.0
    used: int = 0  # tokens charged in [start, end)
    reserved: int = 0  # worst case of the admitted, unfinished requests
    recent: deque = field(default_factory=deque)  # admission times within the last 60 s


class Ledger:
    def __init__(self, db: UsageDB) -> None:
        self.db = db
        self.keys: dict[str, KeyState] = {}

    def state(self, name: str, period: str, now: float) -> KeyState:
        """The key's state, rolled to the period holding ``now`` (its charges read back
        from the database when the period or the key is new here)."""
        st = self.keys.setdefault(name, KeyState())
        if st.period != period or not st.start <= now < st.end:
            st.period = period
            st.start, st.end = period_bounds(period, now)
            st.used = self.db.total_tokens(name, period, st.start)
        return st

    def admit(self, spec: KeySpec, need: int, now: float) -> None:
        """Reserve ``need`` tokens and one request for ``spec``, or raise LimitExceeded
        (then nothing changed)."""
        st = self.state(spec.name, spec.period, now)
        rpm = spec.requests_per_minute
        while st.recent and st.recent[0] <= now - 60:
            st.recent.popleft()
        if rpm is not None and len(st.recent) >= rpm:
            wait = max(1, math.ceil(st.recent[0] + 60 - now))
            raise LimitExceeded(f"requests_per_minute: key '{spec.name}' is limited to {rpm} requests per minute; "
                                f"retry in {wait} s", wait, "rate_limit")
        budget = spec.budget_tokens
        if budget is not None and need > budget:
            raise LimitExceeded(
                f"budget_tokens: this request needs up to {need} tokens (prompt + max tokens), more than key "
                f"'{spec.name}''s whole budget of {budget} per {spec.period}; lower max_tokens",
                max(1, math.ceil(st.end - now)), "budget")
        if budget is not None and st.used + st.reserved + need > budget:
            wait = max(1, math.ceil(st.end - now))
            left = max(0, budget - st.used - st.reserved)
            raise LimitExceeded(
                f"budget_tokens: key '{spec.name}' has {left} of its {budget} tokens per {spec.period} left "
                f"({st.used} charged, {st.reserved} reserved by requests in flight); this request needs up to "
                f"{need} (prompt + max tokens); the {spec.period} ends in {wait} s", wait, "budget")
        st.reserved += need
        st.recent.append(now)

    def settle(self, spec_name: str, period: str, reserved: int, prompt: int, cached: int, completion: int,
               requests: int, now: float) -> None:
        """Drop a reservation and charge the actual usage (durable in the database on return)."""
        st = self.state(spec_name, period, now)
        st.reserved = max(0, st.reserved - reserved)
        st.used += prompt + completion
        if prompt or completion or requests:
            self.db.add(spec_name, self._periods(period, now), prompt, cached, completion, requests)

    @staticmethod
    def _periods(period: str, now: float) -> Iterable[tuple[str, float]]:
        kinds = dict.fromkeys((period, *RECORDED_PERIODS))
        return [(k, period_bounds(k, now)[0]) for k in kinds]

    def snapshot(self, spec: KeySpec, now: float) -> dict:
        """The key's live budget state for /v1/usage."""
        st = self.state(spec.name, spec.period, now)
        out = {"key": spec.name, "period": spec.period, "period_start": iso(st.start),
               "budget_tokens": spec.budget_tokens, "used_tokens": st.used, "reserved_tokens": st.reserved,
               "requests_per_minute": spec.requests_per_minute}
        if spec.budget_tokens is not None:
            out["remaining_tokens"] = max(0, spec.budget_tokens - st.used - st.reserved)
        return out
