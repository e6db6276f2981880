"""Speculative decode steps on the scheduler side: who proposes what, and folding the verdict in.

A verify step is an extend step in which every decode-ready request feeds its last token
and, when it speculates, its ``k`` proposed tokens (``k + 1`` new slots).  Requests that
do not speculate (nothing proposed, gate paused, penalties, a grammar) take part with one
token, exactly as in a decode step.  After the step ``apply_verified`` keeps the tokens the
worker accepted plus its own next token, stops at the first token that finishes the
request, and gives the slots of everything else back at once (``KVManager.discard_rejected``),
so afterwards ``kv_len == fill_len - 1`` as after a decode step.

Constrained requests: a proposal is cut at the first token the grammar rejects, and each
verified row carries the grammar's mask after the tokens before it
(``GrammarState.masks_along``), so the target verifies exactly the distribution it would
sample; the kept tokens then go through the grammar one by one (``after_grammar_token``),
and a jump-forward or a finish ends the step's tokens there (a request in jump-forward is
not decode-ready, so it never speculates).  Not speculated for (docs/ARCHITECTURE.md):
requests with penalties (the worker's counts would have to follow each proposed position)
and constrained requests under a draft model (its proposals are made without the grammar).
Scheduler thread only.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np

from radixserve.constrained.manager import GrammarManager
from radixserve.ipc.worker_link import StepOutput
from radixserve.scheduler.grammar_steps import after_grammar_token
from radixserve.scheduler.kv_manager import KVManager
from radixserve.scheduler.req import Req
from radixserve.scheduler.stop import StopChecker
from radixserve.speculative.strategy import Speculator


class Draft(NamedTuple):
    tokens: list[int]  # [] when the request does not speculate this step
    masks: Optional[np.ndarray] = None  # constrained: bool [len(tokens) + 1, vocab], one per verified row


def may_speculate(req: Req, spec: Speculator) -> bool:
    return not req.sampling.needs_penalty() and (req.grammar is None or not spec.drafts_in_worker)


def propose_drafts(ready: list[Req], spec: Speculator, kv: KVManager, k: int,
                   context_len: int) -> Optional[list[Draft]]:
    """One proposal per ready request, capped so that the step never passes
    ``max_new_tokens`` (one more token always follows the proposal) or the context, cut
    where a grammar rejects it, and trimmed to the slots free now (speculation never
    evicts the cache nor retracts); None when nothing is proposed."""
    budget = kv.free_slots() - len(ready)
    drafts: list[Draft] = []
    for r in ready:
        cap = min(k, r.remaining_new_tokens() - 1, context_len - r.fill_len, budget)
        ok = cap > 0 and may_speculate(r, spec)
        d = spec.propose(r, cap, lambda n, r=r: kv.continuation(r, n))[:cap] if ok else []
        draft = Draft(d)
        if d and r.grammar is not None:
            draft = Draft(*r.grammar.masks_along(d, r.sampling.ignore_eos))
        budget -= len(draft.tokens)
        drafts.append(draft if draft.tokens else Draft([]))
    return drafts if any(d.tokens for d in drafts) else None


def apply_verified(req: Req, k: int, out: StepOutput, kv: KVManager, stops: StopChecker, spec: Speculator,
                   grammars: GrammarManager, jump_forward: bool) -> bool:
    """Fold a verify step's result for ``req`` (``k`` proposed tokens, ``k + 1`` slots from
    ``kv_len``) into the request: output tokens, logprobs, finish reason, ``kv_len``.
    Returns True when a jump-forward left tokens that need an extend step."""
    start = req.kv_len
    req.kv_len += 1  # the last token's KV
    accepted = len(out.spec_ids)
    spec.record(req, k, accepted)
    req.spec_proposed += k
    req.spec_accepted += accepted
    assert out.next_token is not None, "a verify step always emits the target's token"
    tokens = out.spec_ids + [out.next_token]
    lps = out.spec_logprobs + [out.next_logprob] if out.next_logprob is not None else []
    forced = False
    for j, tok in enumerate(tokens):
        if j:
            req.kv_len += 1  # the previous (proposed) token was computed and is kept
        req.output_ids.append(tok)
        if lps:
            req.output_logprobs.append(lps[j])
        if req.grammar is None:
            stops.check(req)
        else:
            forced = after_grammar_token(req, grammars, stops, jump_forward)
        if req.finished or forced:
            break
    kv.discard_rejected(req, k + 1 - (req.kv_len - start))
    return forced
