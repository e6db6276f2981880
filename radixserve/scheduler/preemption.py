"""Priority preemption: which running requests to retract so a higher-priority one can start.

Used by the scheduler before admission when ``enable_priority_preemption`` is on.  Only a
request of strictly lower priority than the blocked one is ever chosen (so equal priorities
never preempt each other, and a victim cannot preempt back), lowest priority first, then
least progress (fewest output tokens), as decode retraction picks.  The scheduler retracts
the victims with its usual retraction: their computed KV stays in the prefix cache, so
re-admission is mostly a cache hit.  Pure: reads the requests and the ``KVManager``,
changes nothing.
"""
from __future__ import annotations

from typing import Iterable, Protocol

from radixserve.config import SchedulerConfig
from radixserve.scheduler.admission import fits
from radixserve.scheduler.policy import order_waiting
from radixserve.scheduler.req import Req


class Memory(Protocol):
    def available(self) -> int: ...

    def match_len(self, req: Req) -> int: ...


def preemption_victims(waiting: Iterable[Req], running: list[Req], kv: Memory, cfg: SchedulerConfig,
                       ratio: float, chunk: int, now: float) -> list[tuple[Req, Req]]:
    """``(victim, head)`` pairs: the running requests to retract, in order, so that ``head``
    (the waiting request the policy admits first) is no longer kept out by
    ``max_running_requests`` or by memory (the test admission makes: ``admission.fits``).
    [] when ``head`` is not blocked or outranks no running request, or when retracting every
    lower-priority request could not unblock it (each victim's whole row counted as freed:
    an upper bound, since shared cached prefixes may stay locked by others; when short, the
    next step retracts more)."""
    waiting = list(waiting)
    if not waiting or not running:
        return []
    top = max(r.sampling.priority for r in waiting)
    cands = sorted((r for r in running if r.sampling.priority < top),
                   key=lambda r: (r.sampling.priority, len(r.output_ids), -len(r.input_ids)))
    if not cands:
        return []
    head = order_waiting([r for r in waiting if r.sampling.priority == top], kv, cfg.schedule_policy,
                         cfg.lpm_queue_limit, cfg.max_queue_wait_s, now)[0]
    extend = head.fill_len - kv.match_len(head)
    n = min(extend, chunk)
    future = head.remaining_new_tokens() * ratio + (extend - n)
    rows, available = len(running), kv.available()
    reserve = sum(r.remaining_new_tokens() for r in running) * ratio

    def blocked() -> bool:
        return rows >= cfg.max_running_requests or not fits(n, future, reserve, available, rows > 0)

    victims: list[tuple[Req, Req]] = []
    for victim in cands:
        if not blocked():
            return victims
        victims.append((victim, head))
        rows -= 1
        available += victim.kv_len
        reserve -= victim.remaining_new_tokens() * ratio
    return [] if blocked() else victims
