"""Admission: which waiting requests join the next extend batch, and with how many tokens.

A request is admitted when its next chunk fits in the free plus evictable slots and, while
anything else runs or was admitted in this round, when the chunk, the rest of its prompt and
``ratio x`` the new tokens it may still make fit on top of what the running requests
reserve (``reserve``); so decode rarely runs out of memory, and with nothing running a
request is always admitted when its chunk fits (nothing starves).  Scheduler thread only.
"""
from __future__ import annotations

from collections import deque
from typing import Any, Optional

from radixserve.config import SchedulerConfig
from radixserve.request import ReqStatus
from radixserve.scheduler.documents import to_compute, window
from radixserve.scheduler.kv_manager import KVManager
from radixserve.scheduler.policy import InBatchPrefixFilter, order_waiting
from radixserve.scheduler.req import Req


def fits(n: int, future: float, reserve: float, available: int, busy: bool) -> bool:
    """Whether a chunk of ``n`` tokens, with ``future`` tokens still to come for it, may be
    admitted now: the chunk must fit, and while anything runs or was admitted in this round,
    also the future tokens plus what the others ``reserve``."""
    return n <= available and (not busy or n + future + reserve <= available)


def admit_waiting(waiting: deque[Req], running: list[Req], kv: KVManager, cfg: SchedulerConfig, ratio: float,
                  batch: list[tuple[Req, int]], token_budget: int, chunk: int, reserve: float,
                  now: Optional[float] = None, lora: Any = None) -> Optional[Req]:
    """Admit waiting requests in policy order (``order_waiting`` at time ``now``) until the
    batch, the token budget or memory is full.

    Mutates: an admitted request moves from ``waiting`` to ``running`` (status RUNNING) with a
    row holding its cached prefix (locked) and ``n`` new slots, and ``(req, n)`` is appended to
    ``batch``; its first admission records its cache hit.  Returns the request whose prompt
    was cut at ``chunk`` (the caller continues it as the chunked request), or None.  ``lora``
    (``LoRAAdmin``): a request whose adapter would exceed ``max_loras_per_batch`` distinct
    adapters running waits, and the requests behind it may go first.
    """
    active = lora.active(running) if lora is not None else None
    in_batch = InBatchPrefixFilter(cfg.in_batch_prefix_threshold if cfg.schedule_policy == "lpm" else 0)
    for req in order_waiting(list(waiting), kv, cfg.schedule_policy, cfg.lpm_queue_limit, cfg.max_queue_wait_s, now):
        if len(running) >= cfg.max_running_requests or token_budget <= 0:
            break
        if active is not None and req.lora is not None and req.lora not in active and len(active) >= lora.max_loras:
            continue  # its adapter waits for a slot
        if req.doc is not None and req.doc.pending:
            continue  # its documents are being computed (scheduler/documents.py)
        match = kv.match_and_lock(req)
        if in_batch.should_defer(req.fill_ids, match.length, req.cache_salt):
            kv.unlock(match)
            continue
        if req.doc is not None:
            kv.place_documents(req, match.length)
        extend = req.fill_len - match.length
        c = min(to_compute(req, match.length), chunk, token_budget)  # tokens computed (reused ones are not)
        n = window(req, match.length, c)
        future = req.remaining_new_tokens() * ratio + (extend - n)
        if not fits(n, future, reserve, kv.available(), bool(running) or bool(batch)) or not kv.sliding_fits(n):
            kv.unlock(match)
            if req.doc is not None:
                kv.drop_documents(req)
            break
        admitted = kv.admit(req, match, n)
        assert admitted, "admission checked kv.available()"
        if not req.admitted_once:
            req.admitted_once = True
            req.cached_tokens = match.length
            kv.record_hit(match.length, len(req.input_ids), match.node)
        if req.return_logprob and req.logprob_start_len == 0 and not req.input_logprobs:
            req.input_logprobs.append(None)  # the first token has none (again after a mid-prompt retraction)
        waiting.remove(req)
        if active is not None and req.lora is not None:
            active.add(req.lora)
        req.status = ReqStatus.RUNNING
        running.append(req)
        batch.append((req, n))
        in_batch.add(req.fill_ids, req.cache_salt)
        reserve += future
        token_budget -= c
        if n < extend:
            return req
    return None
