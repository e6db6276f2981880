"""The scheduler applies the grammar manager's decisions to its requests.

``GrammarManager`` (constrained/manager.py) never writes a ``Req``; these functions are the
only place where its decisions (a rejected token, a ``Finish``, a ``Jump``) change a request.
Scheduler thread only.
"""
from __future__ import annotations

from radixserve.constrained.manager import Finish, GrammarManager
from radixserve.request import FinishReason
from radixserve.scheduler.req import Req
from radixserve.scheduler.stop import StopChecker


def apply_finish(req: Req, done: Finish) -> None:
    if done.append is not None:
        req.output_ids.append(done.append)
    req.finish_reason = done.reason


def drop_last_token(req: Req) -> None:
    """Undo the last sampled token (and its logprob)."""
    req.output_ids.pop()
    if len(req.output_logprobs) > len(req.output_ids):
        req.output_logprobs.pop()


def after_grammar_token(req: Req, grammars: GrammarManager, stops: StopChecker, jump_forward: bool) -> bool:
    """Everything that follows a token sampled for a constrained request: the FSM check, the
    stop check, completion and jump-forward.  Returns True when the request's new output
    tokens need an extend step (a jump left ``kv_len < fill_len - 1``)."""
    rejected = grammars.after_token(req)
    if rejected is not None:
        drop_last_token(req)
        req.finish_reason = rejected
        return False
    stops.check(req)
    if req.finished:
        return False
    decision = grammars.after_stop(req, jump_forward)
    if decision is None:
        return False
    if isinstance(decision, Finish):
        apply_finish(req, decision)
        return False
    req.output_ids[-1:] = decision.tokens
    assert req.grammar is not None
    req.grammar.splice(decision.tokens)
    if req.remaining_new_tokens() == 0:
        req.finish_reason = FinishReason.length(len(req.output_ids))
        return False
    done = grammars.after_jump(req)
    if done is not None:
        apply_finish(req, done)
        return False
    if req.sampling.needs_penalty():
        req.on_worker = False  # resend the sampling state: penalties must count the new tokens
    return len(decision.tokens) > 1
