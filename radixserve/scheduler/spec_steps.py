"""Speculative decode steps on the scheduler side: who proposes what, and folding the verdict in.

A verify step is an extend step in which every decode-ready request feeds its last token
and, when it speculates, its ``k`` proposed tokens (``k + 1`` new slots).  Requests that
do not speculate (nothing proposed, gate paused, penalties, a grammar) take part with one
token, exactly as in a decode step.  After the step ``apply_verified`` keeps the tokens the
worker accepted plus its own next token, stops at the first token that finishes the
request, and gives the slots of everything else back at once (``KVManager.discard_rejected``),
so afterwards ``kv_len == fill_len - 1`` as after a decode step.

Not speculated for (documented in docs/ARCHITECTURE.md): constrained requests (their
grammar state, masks and jump-forward advance one token at a time) and requests with
penalties (the worker's counts would have to follow each proposed position).
Scheduler thread only.
"""
from __future__ import annotations

from typing import Optional

from radixserve.ipc.worker_link import StepOutput
from radixserve.scheduler.kv_manager import KVManager
from radixserve.scheduler.req import Req
from radixserve.scheduler.stop import StopChecker
from radixserve.speculative.strategy import Speculator


def may_speculate(req: Req) -> bool:
    return req.grammar is None and not req.sampling.needs_penalty()


def propose_drafts(ready: list[Req], spec: Speculator, kv: KVManager, k: int,
                   context_len: int) -> Optional[list[list[int]]]:
    """One proposal per ready request ([] for none), capped so that the step never passes
    ``max_new_tokens`` (one more token always follows the proposal) or the context, and
    trimmed to the slots free now (speculation never evicts the cache nor retracts);
    None when nothing is proposed."""
    budget = kv.free_slots() - len(ready)
    drafts: list[list[int]] = []
    for r in ready:
        cap = min(k, r.remaining_new_tokens() - 1, context_len - r.fill_len, budget)
        d = spec.propose(r, cap, lambda n, r=r: kv.continuation(r, n))[:cap] if cap > 0 and may_speculate(r) else []
        budget -= len(d)
        drafts.append(d)
    return drafts if any(drafts) else None


def apply_verified(req: Req, k: int, out: StepOutput, kv: KVManager, stops: StopChecker, spec: Speculator) -> None:
    """Fold a verify step's result for ``req`` (``k`` proposed tokens, ``k + 1`` slots from
    ``kv_len``) into the request: output tokens, logprobs, finish reason, ``kv_len``."""
    start = req.kv_len
    req.kv_len += 1  # the last token's KV
    accepted = len(out.spec_ids)
    spec.record(req, k, accepted)
    req.spec_proposed += k
    req.spec_accepted += accepted
    assert out.next_token is not None, "a verify step always emits the target's token"
    tokens = out.spec_ids + [out.next_token]
    lps = out.spec_logprobs + [out.next_logprob] if out.next_logprob is not None else []
    for j, tok in enumerate(tokens):
        if j:
            req.kv_len += 1  # the previous (proposed) token was computed and is kept
        req.output_ids.append(tok)
        if lps:
            req.output_logprobs.append(lps[j])
        stops.check(req)
        if req.finished:
            break
    kv.discard_rejected(req, k + 1 - (req.kv_len - start))
