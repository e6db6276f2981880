"""Scheduler glue for constrained requests: the grammar side decides, the scheduler applies.

Contract (all calls come from the scheduler thread).  The manager never writes a request:
it advances the request's ``GrammarState`` (grammar-owned) in ``after_token`` and otherwise
returns decisions, which the scheduler applies (``scheduler/grammar_steps.py``):
- ``add(req)``: a constrained request waits here (``waiting``) while its grammar compiles;
  the scheduler's queue and running batch never wait for a compilation.
- ``ready()`` returns ``(ready, failed)``: ``(req, GrammarState)`` pairs whose grammar is
  compiled (the scheduler sets ``req.grammar``) and ``(req, FinishReason)`` pairs whose
  compilation failed or timed out (an abort naming the cause).
- ``mask(req)`` is the vocab mask to send with a sampling step.
- ``after_token(req)`` runs once per emitted token, before the stop check: it advances the
  FSM and returns None, or returns the abort reason when the token was rejected (the
  scheduler drops the token and finishes the request; this only happens when no allowed
  token could be sampled).
- ``after_stop(req, jump_forward)`` runs after the stop check of an unfinished request and
  returns a ``Finish`` (the grammar is complete or dead), a ``Jump`` (forced tokens to splice
  in place of the last output token: the scheduler writes them into ``output_ids`` and calls
  ``req.grammar.splice``) or None.  After applying a ``Jump`` the scheduler asks
  ``after_jump(req)``, which returns a ``Finish`` or None for the spliced state.
- Reasoning models: with ``think_end_id`` set (the scheduler's ``--reasoning-parser``), the
  grammar of a request with ``require_reasoning`` comes wrapped in a ``ReasonerState``
  (runtime/reasoner_state.py) that masks nothing until the think-end token; ``thinking_state``
  gives a request with a ``thinking_token_budget`` and no constraint such a state over no
  grammar, ready at once (no compilation).
- Nothing here runs for requests without a grammar, and the backend (``cfg.grammar_backend``:
  vocabulary, compile processes or threads) is created on the first constrained request.
"""
from __future__ import annotations

import concurrent.futures
import logging
from dataclasses import dataclass
from typing import Any, Generic, Optional, TypeVar, Union

import numpy as np

from radixserve.config import SchedulerConfig
from radixserve.constrained.schema import budget
from radixserve.constrained.runtime.backend import GrammarBackend
from radixserve.constrained.runtime.registry import make_backend
from radixserve.constrained.runtime.fsm_state import GrammarState
from radixserve.constrained.runtime.jump_forward import plan_jump
from radixserve.constrained.runtime.reasoner_state import ReasonerState
from radixserve.constrained.protocols import GrammarRequest, GrammarSampling
from radixserve.constrained.schema.spec import Constraint, constraint_of
from radixserve.request import FinishReason

logger = logging.getLogger(__name__)

R = TypeVar("R", bound=GrammarRequest)  # the caller's request type, handed back as given


def has_constraint(sp: GrammarSampling) -> bool:
    return (sp.regex is not None or sp.json_schema is not None or sp.choices is not None
            or getattr(sp, "ebnf", None) is not None)


@dataclass(frozen=True)
class Finish:
    """End the request with ``reason``, after appending ``append`` (EOS, when it is the only
    token the grammar allows: no model step is needed for it) when that is not None."""

    reason: FinishReason
    append: Optional[int] = None


@dataclass(frozen=True)
class Jump:
    """Replace the request's last output token with ``tokens`` (then ``GrammarState.splice(tokens)``)."""

    tokens: list[int]


class GrammarManager(Generic[R]):
    def __init__(self, cfg: SchedulerConfig, tokenizer: Any, vocab_size: int, eos_ids: tuple[int, ...]) -> None:
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_ids = tuple(eos_ids)
        self.backend: Optional[GrammarBackend] = None
        self.waiting: list[tuple[R, Constraint]] = []
        self.num_jumps = 0
        self.jumped_tokens = 0
        self.think_end_id: Optional[int] = None  # the reasoning format's think-end token (build_scheduler sets it)

    def get_backend(self) -> GrammarBackend:
        if self.backend is None:
            if self.tokenizer is None:
                raise ValueError("sampling_params: constrained generation needs the model's tokenizer")
            self.backend = make_backend(self.tokenizer, self.vocab_size, self.eos_ids, self.cfg)
        return self.backend

    # ------------------------------------------------------------------ compile
    def add(self, req: R) -> None:
        # the front door (request_builder) validated the constraint: llguidance's check is not run
        # twice per request; a problem it would have found fails this request's compile instead
        c = constraint_of(req.sampling, self.cfg.json_whitespace_pattern, self.cfg.grammar_backend, validate=False)
        assert c is not None, "add() takes constrained requests only"
        self.get_backend().request(c)
        self.waiting.append((req, c))

    def ready(self) -> tuple[list[tuple[R, GrammarState]], list[tuple[R, FinishReason]]]:
        done: list[tuple[R, GrammarState]] = []
        failed: list[tuple[R, FinishReason]] = []
        still: list[tuple[R, Constraint]] = []
        for req, c in self.waiting:
            got = self.get_backend().poll(c)
            if got is None:
                still.append((req, c))
            elif isinstance(got, Exception):
                failed.append((req, FinishReason.abort(f"{c.kind} constraint could not be compiled: {got}")))
            else:
                gs = got.new_state()
                if gs.outcome() == "dead":
                    failed.append((req, FinishReason.abort(
                        f"{c.kind} constraint: no token of the vocabulary can start the pattern")))
                else:
                    done.append((req, self._deferred(req, gs)))
        self.waiting = still
        return done, failed

    def _deferred(self, req: GrammarRequest, gs: Optional[GrammarState]) -> GrammarState:
        """``gs`` deferred until the request's thinking ends when it thinks (else ``gs`` itself)."""
        sp = req.sampling
        if not sp.require_reasoning or self.think_end_id is None:
            assert gs is not None
            return gs
        return ReasonerState(gs, self.think_end_id, self.vocab_size, sp.thinking_token_budget, self.eos_ids)

    def thinking_state(self, req: GrammarRequest) -> Optional[GrammarState]:
        """The state of an unconstrained request with a thinking budget (its thinking is closed
        after ``thinking_token_budget`` tokens); None when the request needs none."""
        sp = req.sampling
        if sp.thinking_token_budget is None or not sp.require_reasoning or self.think_end_id is None:
            return None
        return self._deferred(req, None)

    def wait(self, timeout: float) -> None:
        """Block until a compilation finishes (only when nothing else can run)."""
        futs = self.backend.pending_futures() if self.backend is not None else []
        if futs:
            concurrent.futures.wait(futs, timeout=timeout, return_when=concurrent.futures.FIRST_COMPLETED)

    def remove(self, rid: str) -> Optional[R]:
        for entry in self.waiting:
            if entry[0].rid == rid:
                self.waiting.remove(entry)
                return entry[0]
        return None

    # ------------------------------------------------------------------ per token
    @staticmethod
    def mask(req: GrammarRequest) -> Optional[np.ndarray]:
        """The vocab mask of the request's next sample (None: nothing masked)."""
        gs = _grammar(req)
        mask = gs.mask(req.sampling.ignore_eos)
        if mask is not None and gs.answer_start is not None and req.sampling.constraint_budget == "close":
            answer = req.output_ids[gs.answer_start:]  # the constrained part (after any thinking)
            return budget.closing_mask(mask, gs.vocab, answer, req.remaining_new_tokens())
        return mask

    def after_token(self, req: GrammarRequest) -> Optional[FinishReason]:
        tok = req.output_ids[-1]
        gs = _grammar(req)
        if tok in self.eos_ids and gs.is_accepting() and not req.sampling.ignore_eos:
            return None  # the stop check ends it
        if gs.accept(tok):
            return None
        return FinishReason.abort(
            f"constrained generation reached a dead end: no allowed token could be sampled (got {tok})")

    def _complete(self, req: GrammarRequest, jump_forward: bool) -> Optional[Finish]:
        """A Finish when the request must end (dead end, or complete and nothing more to do)."""
        gs, sp = _grammar(req), req.sampling
        out = gs.outcome()
        if out is None:
            return None
        if out == "dead":
            return Finish(FinishReason.abort("constrained generation reached a dead end: no token can follow"))
        eos_ok = bool(self.eos_ids) and not sp.ignore_eos and len(req.output_ids) >= sp.min_new_tokens
        if not eos_ok:  # the pattern is complete but EOS may not be emitted: stop here
            return Finish(FinishReason.stop(None))
        if jump_forward and not req.return_logprob and req.remaining_new_tokens() > 0:
            eos = self.eos_ids[0]  # EOS is the only choice: no model step needed
            return Finish(FinishReason.stop(eos), append=eos)
        return None  # the next step samples EOS (the mask allows nothing else)

    def after_stop(self, req: GrammarRequest, jump_forward: bool) -> Union[Finish, Jump, None]:
        done = self._complete(req, jump_forward)
        if done is not None or not jump_forward or not _grammar(req).has_prev:
            return done
        plan = plan_jump(req, _grammar(req), self.get_backend().vocab)
        if plan is None:
            return None
        self.num_jumps += 1
        self.jumped_tokens += len(plan) - 1
        return Jump(plan)

    def after_jump(self, req: GrammarRequest) -> Optional[Finish]:
        """After a ``Jump`` was applied (the FSM spliced, the tokens in ``output_ids``)."""
        return self._complete(req, True)

    def stats(self) -> dict:
        b = self.backend
        return {"grammar_backend": self.cfg.grammar_backend, "grammar_jumps": self.num_jumps, "grammar_jumped_tokens": self.jumped_tokens,
                "grammar_cached": 0 if b is None else len(b.cache),
                "grammar_compiling": 0 if b is None else len(b.inflight)}


def _grammar(req: GrammarRequest) -> GrammarState:
    gs = req.grammar
    assert gs is not None, f"{req.rid}: no compiled grammar"
    return gs
