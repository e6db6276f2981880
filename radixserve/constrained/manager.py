"""Scheduler glue for constrained requests.

Contract (all calls come from the scheduler thread):
- ``add(req)``: a constrained request waits here (``waiting``) while its index compiles;
  the scheduler's queue and running batch never wait for a compilation.
- ``ready()`` returns ``(ready, failed)``: requests whose grammar is compiled (their
  ``req.grammar`` is set) and requests whose compilation failed or timed out (already given
  a ``FinishReason.abort`` naming the cause).
- ``mask(req)`` is the vocab mask to send with a sampling step.
- ``after_token(req)`` runs once per emitted token, before the stop check, and returns
  False when the token was rejected (it is removed and the request finished as a dead end;
  this only happens when no allowed token could be sampled).  ``after_stop(req)`` runs
  after the stop check of an unfinished request: it ends a request whose grammar is
  complete, or jump-forwards; it returns True when the request's new output tokens need an
  extend step (kv_len < fill_len - 1).
- Nothing here runs for requests without a grammar, and the backend (vocabulary, compile
  processes) is created on the first constrained request.
"""
from __future__ import annotations

import concurrent.futures
import logging
from typing import Any, Optional

from radixserve.constrained.fsm_state import GrammarState
from radixserve.constrained.jump_forward import plan_jump
from radixserve.constrained.spec import constraint_of
from radixserve.scheduler.req import FinishReason

logger = logging.getLogger(__name__)


def has_constraint(sp: Any) -> bool:
    return sp.regex is not None or sp.json_schema is not None or sp.choices is not None


class GrammarManager:
    def __init__(self, cfg: Any, tokenizer: Any, vocab_size: int, eos_ids: tuple[int, ...]) -> None:
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_ids = tuple(eos_ids)
        self.backend: Optional[Any] = None
        self.waiting: list[Any] = []
        self.num_jumps = 0
        self.jumped_tokens = 0

    def get_backend(self) -> Any:
        if self.backend is None:
            if self.tokenizer is None:
                raise ValueError("sampling_params: constrained generation needs the model's tokenizer")
            from radixserve.constrained.backend import GrammarBackend

            self.backend = GrammarBackend(self.tokenizer, self.vocab_size, self.eos_ids, self.cfg)
        return self.backend

    # ------------------------------------------------------------------ compile
    def add(self, req: Any) -> None:
        c = constraint_of(req.sampling, self.cfg.json_whitespace_pattern)
        req.extra["constraint"] = c
        self.get_backend().request(c)
        self.waiting.append(req)

    def ready(self) -> tuple[list[Any], list[Any]]:
        done, failed, still = [], [], []
        for req in self.waiting:
            c = req.extra["constraint"]
            got = self.backend.poll(c)
            if got is None:
                still.append(req)
            elif isinstance(got, Exception):
                req.finish_reason = FinishReason.abort(f"{c.kind} constraint could not be compiled: {got}")
                failed.append(req)
            else:
                gs = GrammarState(got)
                if gs.outcome() == "dead":
                    req.finish_reason = FinishReason.abort(
                        f"{c.kind} constraint: no token of the vocabulary can start the pattern")
                    failed.append(req)
                else:
                    req.grammar = gs
                    done.append(req)
        self.waiting = still
        return done, failed

    def wait(self, timeout: float) -> None:
        """Block until a compilation finishes (only when nothing else can run)."""
        futs = self.backend.pending_futures() if self.backend is not None else []
        if futs:
            concurrent.futures.wait(futs, timeout=timeout, return_when=concurrent.futures.FIRST_COMPLETED)

    def remove(self, rid: str) -> Optional[Any]:
        for req in self.waiting:
            if req.rid == rid:
                self.waiting.remove(req)
                return req
        return None

    # ------------------------------------------------------------------ per token
    @staticmethod
    def mask(req: Any) -> Any:
        return req.grammar.mask(req.sampling.ignore_eos)

    def after_token(self, req: Any) -> bool:
        tok = req.output_ids[-1]
        gs = req.grammar
        if tok in self.eos_ids and gs.grammar.is_final(gs.state) and not req.sampling.ignore_eos:
            return True  # the stop check ends it
        if gs.accept(tok):
            return True
        req.output_ids.pop()
        if len(req.output_logprobs) > len(req.output_ids):
            req.output_logprobs.pop()
        req.finish_reason = FinishReason.abort(
            f"constrained generation reached a dead end: no allowed token could be sampled (got {tok})")
        return False

    def _end_if_complete(self, req: Any, jump_forward: bool) -> bool:
        """True when the request ended (dead end, or complete and nothing more to do)."""
        gs, sp = req.grammar, req.sampling
        out = gs.outcome()
        if out is None:
            return False
        if out == "dead":
            req.finish_reason = FinishReason.abort("constrained generation reached a dead end: no token can follow")
            return True
        eos_ok = bool(self.eos_ids) and not sp.ignore_eos and len(req.output_ids) >= sp.min_new_tokens
        if not eos_ok:  # the pattern is complete but EOS may not be emitted: stop here
            req.finish_reason = FinishReason.stop(None)
            return True
        if jump_forward and not req.return_logprob and req.remaining_new_tokens() > 0:
            req.output_ids.append(self.eos_ids[0])  # EOS is the only choice: no model step needed
            req.finish_reason = FinishReason.stop(self.eos_ids[0])
            return True
        return False  # the next step samples EOS (the mask allows nothing else)

    def after_stop(self, req: Any, jump_forward: bool) -> bool:
        if self._end_if_complete(req, jump_forward) or not jump_forward:
            return False
        gs = req.grammar
        plan = plan_jump(req, gs, self.backend.vocab)
        if plan is None:
            return False
        new, states = plan
        req.output_ids[-1:] = new
        gs.splice(new, states)
        self.num_jumps += 1
        self.jumped_tokens += len(new) - 1
        if req.remaining_new_tokens() == 0:
            req.finish_reason = FinishReason.length(len(req.output_ids))
            return False
        if self._end_if_complete(req, jump_forward):
            return False
        if req.sampling.needs_penalty():
            req.on_worker = False  # resend the sampling state: penalties must count the new tokens
        return len(new) > 1

    def stats(self) -> dict:
        b = self.backend
        return {"grammar_jumps": self.num_jumps, "grammar_jumped_tokens": self.jumped_tokens,
                "grammar_cached": 0 if b is None else len(b.cache),
                "grammar_compiling": 0 if b is None else len(b.inflight)}
