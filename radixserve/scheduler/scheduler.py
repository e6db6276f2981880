"""Continuous batching over the prefix cache.

Each ``step()`` runs one model step: an extend (prefill) batch when waiting requests can
be admitted (with ``enable_mixed_chunk`` also one token of every decode-ready request),
otherwise one decode step for every running request.  Admission reserves
memory for the decode tokens requests will still need; when decode runs out anyway,
requests are retracted (their computed KV stays cached) and re-queued.

Single-threaded: every method runs on the thread that drives ``step()``.  Memory moves
only through ``KVManager`` (never its table, allocator or cache); grammar decisions come
from ``GrammarManager`` and are applied in ``grammar_steps.py``.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any, Callable, Optional, Protocol, Sequence

from radixserve.config import SchedulerConfig
from radixserve.constrained.manager import GrammarManager, has_constraint
from radixserve.ipc.worker_link import StepPlan, StepReq, StepResult
from radixserve.request import FinishReason, ReqStatus
from radixserve.scheduler.admission import admit_waiting
from radixserve.scheduler.documents import DocumentRequests, to_compute, window
from radixserve.scheduler.lora_admin import LoRAAdmin
from radixserve.scheduler.grammar_steps import after_grammar_token
from radixserve.scheduler.kv_manager import KVManager
from radixserve.scheduler.plan import make_step_req
from radixserve.scheduler.pooling import add_pooled
from radixserve.scheduler.preemption import preemption_victims
from radixserve.scheduler.req import Req
from radixserve.scheduler.spec_steps import apply_verified, propose_drafts
from radixserve.scheduler.stop import StopChecker
from radixserve.speculative.strategy import NoSpeculation, Speculator

logger = logging.getLogger(__name__)


class Worker(Protocol):
    def step(self, plan: StepPlan) -> StepResult: ...


class Scheduler:
    def __init__(self, cfg: SchedulerConfig, worker: Worker, kv: KVManager, context_len: int,
                 stop_checker: StopChecker, vocab_size: int, spec: Optional[Speculator] = None) -> None:
        self.cfg = cfg
        self.spec: Speculator = spec or NoSpeculation()  # proposes tokens for decode steps to verify
        self.worker = worker
        self.kv = kv
        self.context_len = context_len
        self.stops = stop_checker
        self.vocab_size = vocab_size
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self.chunked: Optional[Req] = None
        self.ratio = cfg.new_token_ratio
        self._release: list[str] = []
        self.num_retractions = 0
        # work the model did: tokens forwarded (prefill chunks, decode and verify rows) and steps
        self.forward_tokens = 0
        self.forward_steps = 0
        self.hooks: list[Callable[[Req], None]] = []  # called for every finished request
        # structured generation: requests waiting for their grammar, and requests whose
        # jump-forward tokens need an extend step (both empty without constrained requests)
        self.grammars: GrammarManager[Req] = GrammarManager(cfg, stop_checker.tokenizer, vocab_size,
                                                            stop_checker.eos_ids)
        self._forced: list[Req] = []
        self._mixed: set[int] = set()  # ids of the decode rows in the step being planned (enable_mixed_chunk)
        self.clock: Callable[[], float] = time.perf_counter  # arrival times and the wait bound (tests fake it)
        self.lora = LoRAAdmin(worker, 0)  # build_scheduler sets the slots when LoRA is on
        # order-free document reuse (scheduler/documents.py): why this worker cannot place documents
        # (build_scheduler sets it from WorkerInfo), and the internal requests computing documents
        self.doc_refusal: Optional[str] = None
        self.documents = DocumentRequests()

    # ------------------------------------------------------------------ requests
    def add_request(self, req: Req) -> None:
        """Queue a request validated and clamped by ``radixserve.request_builder`` (not re-checked
        here); raises OverflowError when the waiting queue is full."""
        if (self.cfg.max_queued_requests is not None
                and len(self.waiting) + len(self.grammars.waiting) >= self.cfg.max_queued_requests):
            raise OverflowError("the waiting queue is full")
        if req.arrival is None:
            req.arrival = self.clock()
        if req.doc_spans:
            for doc in self.documents.add(req, self.kv, self.cfg.document_recompute, self.doc_refusal,
                                          self.cfg.document_select):
                doc.arrival = req.arrival
                self.kv.prefetch(doc)
                self.waiting.appendleft(doc)  # documents first: their requests wait for them
        self.kv.prefetch(req)  # the hierarchical cache starts reading its disk blocks while it waits
        if has_constraint(req.sampling):
            self.grammars.add(req)  # joins the queue once its grammar is compiled
            return
        req.grammar = self.grammars.thinking_state(req)  # a thinking budget alone: no grammar to compile
        self.waiting.append(req)

    def abort(self, rid: str, message: str = "aborted") -> Optional[Req]:
        req = self.grammars.remove(rid) if self.grammars.waiting else None
        if req is not None:
            req.finish_reason = FinishReason.abort(message)
            self._finish(req)
            return req
        for req in list(self.waiting):
            if req.rid == rid:
                self.waiting.remove(req)
                req.finish_reason = FinishReason.abort(message)
                self._finish(req)
                return req
        for req in self.running:
            if req.rid == rid and not req.finished:
                req.finish_reason = FinishReason.abort(message)
                self._retire(req)
                return req
        return None

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.grammars.waiting)

    # ------------------------------------------------------------------ one step
    def step(self) -> list[Req]:
        """Run one model step; returns the requests that produced output or finished."""
        touched: list[Req] = self._grammars_ready() if self.grammars.waiting else []
        if self.lora.pending:
            self.lora.collect(self.lora_users)
        plan, batch = self._prefill_plan()
        forced = plan is None and bool(self._forced)
        if forced:
            plan, batch = self._forced_plan()
        if plan is None:
            plan, batch, more = self._decode_plan()
            touched += more
        if plan is None:
            if self._release:
                self.worker.step(StepPlan(False, [], self._take_release()))
            if self.grammars.waiting and not self.running and not self.waiting:
                self.grammars.wait(0.05)  # nothing else to run: sleep until a compilation ends
            return touched
        result = self.worker.step(plan)
        self.forward_tokens += sum(len(r.input_ids) if r.compute is None else len(r.compute) for r in plan.reqs)
        self.forward_steps += 1
        verify = any(r.num_draft for r in plan.reqs)  # decode-ready tokens only: nothing to cache yet
        touched += self._process(plan, batch, result, cache=not forced and not verify)
        return [r for r in touched if not r.internal] if self.documents.used else touched

    def lora_users(self, uid: str) -> int:
        """Requests queued or running with LoRA adapter ``uid``."""
        compiling = (req for req, _ in self.grammars.waiting)  # (request, constraint) pairs
        return sum(1 for r in (*self.running, *self.waiting, *compiling) if r.lora == uid)

    def _grammars_ready(self) -> list[Req]:
        ready, failed = self.grammars.ready()
        for req, gs in ready:
            req.grammar = gs
            self.waiting.append(req)
        for req, reason in failed:
            req.finish_reason = reason
            self._finish(req)
        return [req for req, _ in failed]

    def _take_release(self) -> list[str]:
        out, self._release = self._release, []
        return out

    # ------------------------------------------------------------------ extend
    def _prefill_plan(self):
        cfg, kv = self.cfg, self.kv
        token_budget = cfg.max_prefill_tokens
        chunk = cfg.chunked_prefill_size if cfg.chunked_prefill_size and cfg.chunked_prefill_size > 0 else 1 << 30
        if cfg.enable_priority_preemption and self.waiting and self.running:
            for victim, head in preemption_victims(self.waiting, self.running, kv, cfg, self.ratio,
                                                   min(chunk, token_budget), self.clock()):
                self._retract(victim, f"preempted for {head.rid}")
        reserve = sum(r.remaining_new_tokens() for r in self.running) * self.ratio
        batch: list[tuple[Req, int]] = []
        if self.chunked is not None:
            req = self.chunked
            c = min(to_compute(req, req.kv_len), chunk, token_budget)  # tokens computed (reused ones are not)
            n = window(req, req.kv_len, c)
            if not kv.alloc_extend([(req, n)]):
                if not any(r.kv_len == r.fill_len - 1 for r in self.running):
                    self._retract(req)  # nothing can decode to free memory: start it over
                return None, None
            batch.append((req, n))
            token_budget -= c
            if req.kv_len + n == req.fill_len:
                self.chunked = None
        if self.chunked is None and self.waiting and len(self.running) < cfg.max_running_requests:
            self.chunked = admit_waiting(self.waiting, self.running, kv, cfg, self.ratio, batch, token_budget,
                                         min(chunk, token_budget), reserve, self.clock(), self.lora)
        if not batch:
            return None, None
        if self.cfg.enable_mixed_chunk and isinstance(self.spec, NoSpeculation):
            batch += self._decode_rows(batch)
        return StepPlan(False, [self._step_req(r, n) for r, n in batch], self._take_release()), batch

    def _decode_rows(self, batch: list[tuple[Req, int]]) -> list[tuple[Req, int]]:
        """``enable_mixed_chunk``: every decode-ready request as a one-token row of this extend
        step (memory permitting, without eviction of running work), so a prefill does not stall
        the running requests for a step.  Their rows are not inserted into the cache
        (``_process``), as a decode step's are not."""
        taken = {id(r) for r, _ in batch}
        rows = [(r, 1) for r in self.running
                if r.kv_len == r.fill_len - 1 and r is not self.chunked and id(r) not in taken and not r.finished]
        if not rows or not self.kv.alloc_extend(rows):
            return []
        self._mixed = {id(r) for r, _ in rows}
        return rows

    def _step_req(self, req: Req, n: int, draft: Sequence[int] = (), masks: Any = None) -> StepReq:
        sr = make_step_req(req, self.kv.row(req), n, self.stops.eos_ids, draft, self.spec.drafts_in_worker)
        sr.swa_slots = self.kv.sliding_slots(sr.slots)  # None without a sliding-window pool
        if sr.swa_slots is not None and sr.prefix_slots is not None:
            sr.prefix_swa = self.kv.sliding_slots(sr.prefix_slots)
        if req.grammar is not None and sr.sample:  # one mask per verified row when speculating
            sr.vocab_mask = masks if masks is not None else self.grammars.mask(req)
        return sr

    def _forced_plan(self):
        """One extend step over the jump-forward tokens of ``self._forced`` plus one token for
        every decode-ready request, so a jump never stalls the rest of the batch."""
        pend = [r for r in self._forced if r.status == ReqStatus.RUNNING and not r.finished
                and r is not self.chunked and r.kv_len < r.fill_len - 1]
        self._forced = []
        if not pend:
            return None, None
        ready = [r for r in self.running if r.kv_len == r.fill_len - 1 and r is not self.chunked]
        batch = [(r, r.fill_len - r.kv_len) for r in pend] + [(r, 1) for r in ready]
        if not self.kv.alloc_extend(batch):  # no memory: the jumped requests start over from the cache
            for r in pend:
                self._retract(r)
            return None, None
        return StepPlan(False, [self._step_req(r, n) for r, n in batch], self._take_release()), batch

    # ------------------------------------------------------------------ decode
    def _decode_plan(self):
        kv = self.kv
        ready = [r for r in self.running if r.kv_len == r.fill_len - 1 and r is not self.chunked]
        touched: list[Req] = []
        if not ready:
            return None, None, touched
        while not kv.make_room(len(ready)):
            holders = [r for r in self.running if r not in ready]  # mid-prefill requests
            if len(ready) > 1:
                victim = min(ready, key=lambda r: (r.sampling.priority, len(r.output_ids), -len(r.input_ids)))
                ready.remove(victim)
            elif holders:
                victim = holders[0]
            else:  # cannot happen while max_new_tokens is clamped to the pool; never hang
                victim = ready.pop()
                victim.finish_reason = FinishReason.abort("out of KV cache memory")
                self._retire(victim)
                touched.append(victim)
                continue
            self._retract(victim)
        if not ready:
            return None, None, touched
        self.ratio = max(self.cfg.new_token_ratio, self.ratio - 0.002)
        drafts = propose_drafts(ready, self.spec, kv, self.cfg.speculative_num_tokens, self.context_len)
        if drafts is not None:  # a verify step: an extend over each last token and its proposal
            batch = [(r, 1 + len(d.tokens)) for r, d in zip(ready, drafts)]
            assert kv.alloc_extend(batch), "propose_drafts fits the proposals in the free slots"
            reqs = [self._step_req(r, 1, d.tokens, d.masks) for r, d in zip(ready, drafts)]
            return StepPlan(False, reqs, self._take_release()), batch, touched
        kv.alloc_decode(ready)
        reqs = [self._step_req(req, 1) for req in ready]
        return StepPlan(True, reqs, self._take_release()), [(r, 1) for r in ready], touched

    def _retract(self, req: Req, why: str = "") -> None:
        """Give the request's memory back (its computed prefix stays cached) and re-queue it;
        ``why`` names a preemption (else the KV pool was full, and admission gets stricter)."""
        self.num_retractions += 1
        req.retractions += 1
        if req.kv_len < len(req.input_ids):
            req.input_logprobs.clear()  # recomputed on re-admission
        self.kv.release(req)
        self.running.remove(req)
        if self.chunked is req:
            self.chunked = None
        self._release.append(req.rid)
        req.status = ReqStatus.WAITING
        self.waiting.appendleft(req)
        if not why:
            self.ratio = min(1.0, self.ratio + 0.1)
        logger.info("retracted %s (%s); %d waiting", req.rid, why or "kv pool full", len(self.waiting))

    # ------------------------------------------------------------------ results
    def _process(self, plan: StepPlan, batch, result: StepResult, cache: bool = True) -> list[Req]:
        touched = []
        mixed, self._mixed = self._mixed, set()  # decode rows of a mixed extend step
        for (req, n), sr, out in zip(batch, plan.reqs, result.outputs):
            if req.finished:  # aborted while the step ran
                continue
            if sr.num_draft:
                if apply_verified(req, sr.num_draft, out, self.kv, self.stops, self.spec, self.grammars,
                                  self.cfg.enable_jump_forward):
                    self._forced.append(req)
                if req.finished:
                    self._retire(req)
                touched.append(req)
                continue
            req.kv_len += n
            req.input_logprobs.extend(out.prompt_logprobs)
            if out.hidden is not None:
                add_pooled(req, sr.start, out.hidden)
            if out.next_token is not None:
                req.output_ids.append(out.next_token)
                if out.next_logprob is not None:
                    req.output_logprobs.append(out.next_logprob)
                if req.grammar is None:
                    self.stops.check(req)
                elif after_grammar_token(req, self.grammars, self.stops, self.cfg.enable_jump_forward):
                    self._forced.append(req)
            elif req.kv_len == req.fill_len and req.remaining_new_tokens() == 0:
                req.finish_reason = FinishReason.length(len(req.output_ids))
            if req.finished:
                self._retire(req)
            elif not plan.decode and cache and id(req) not in mixed and self.kv.cache_unfinished(req):
                req.resync = True
            touched.append(req)
        return touched

    def _retire(self, req: Req) -> None:
        if req.row is not None:
            self.kv.release(req)
        if req in self.running:
            self.running.remove(req)
        if self.chunked is req:
            self.chunked = None
        self._release.append(req.rid)
        self._finish(req)

    def _finish(self, req: Req) -> None:
        req.status = ReqStatus.FINISHED
        if self.documents.used and self.documents.finished(req):
            return  # an internal document request: nobody waits for its output
        for hook in self.hooks:
            hook(req)

    # ------------------------------------------------------------------ admin
    def flush_cache(self) -> bool:
        if self.running:
            return False
        return self.kv.flush()

    def check_invariants(self) -> None:
        self.kv.check_invariants()

    def stats(self) -> dict[str, Any]:
        s = self.kv.stats()
        s.update(running=len(self.running), waiting=len(self.waiting), retractions=self.num_retractions,
                 forward_tokens=self.forward_tokens, forward_steps=self.forward_steps)
        if self.grammars.backend is not None:
            s.update(self.grammars.stats())
        return s
