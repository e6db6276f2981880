"""The one front door for requests: validation, clamping and n-expansion, done once.

Used by the in-process ``Engine`` (and through it by ``frontend_lang``) and by the server's
``TokenizerManager``.  ``RequestBuilder.build`` turns prompts (token ids) with their sampling
parameters into single sequences (``TokenizedRequest``, n == 1), against the ``Limits`` the
model worker reported.  Per prompt it calls ``SamplingParams.verify`` exactly once and checks
a constraint (regex / json_schema / choices) once; every copy of an ``n > 1`` prompt gets
``seed + i``.  Errors are ``ValueError`` whose message starts with the field's name (the server
turns them into 400s).  Nothing downstream (scheduler) validates again.

This module stays light (no torch): the server process imports it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Union

from radixserve.config import DEFAULT_GRAMMAR_BACKEND
from radixserve.constrained.spec import constraint_of
from radixserve.embedding import check_pooling
from radixserve.ipc.server_link import TokenizedRequest
from radixserve.ipc.worker_link import WorkerInfo
from radixserve.sampling_params import SamplingParams
from radixserve.utils import new_rid

MAX_TOP_LOGPROBS = 64  # top-k logprobs travel per token (prompt ones too): bound the message size
MAX_SEQUENCES = 1024  # prompts x n of one call

ParamsIn = Union[dict, SamplingParams, None]


@dataclass(frozen=True)
class Limits:
    """What a loaded model worker can take: token ids in [0, vocab_size), sequences up to
    ``context_len`` tokens, ``num_slots`` KV slots (one reserved), ``max_rows`` running requests."""

    vocab_size: int
    context_len: int
    num_slots: int
    max_rows: int

    @classmethod
    def of(cls, info: WorkerInfo) -> "Limits":
        return cls(info.vocab_size, info.context_len, info.num_slots, info.max_rows)

    @property
    def kv_capacity(self) -> int:
        return self.num_slots - 1  # slot 0 is the padding slot

    @property
    def max_seq_len(self) -> int:
        """Prompt plus output tokens one sequence may reach."""
        return min(self.context_len, self.kv_capacity)


def verify_sampling(sp: SamplingParams, vocab_size: int, grammar_backend: str = DEFAULT_GRAMMAR_BACKEND) -> None:
    """``sp.verify`` plus the constraint check (by ``grammar_backend``, the scheduler's):
    raise ValueError naming the first bad field."""
    sp.verify(vocab_size)
    constraint_of(sp, backend=grammar_backend)  # None when unconstrained; else the parser's message


class RequestBuilder:
    """Stateless apart from its limits; safe to call from any thread.  ``grammar_backend`` is
    the scheduler's (``SchedulerConfig.grammar_backend``): constraints are validated as it
    will compile them."""

    def __init__(self, limits: Limits, grammar_backend: str = DEFAULT_GRAMMAR_BACKEND) -> None:
        self.limits = limits
        self.grammar_backend = grammar_backend

    def check_prompt(self, ids: list[int], name: str) -> None:
        """Raise ValueError (naming ``name``) unless ``ids`` is a usable prompt."""
        if not ids:
            raise ValueError(f"{name}: the prompt is empty")
        vocab = self.limits.vocab_size
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise ValueError(f"{name}: must be a list of ints")
        if min(ids) < 0 or max(ids) >= vocab:
            raise ValueError(f"{name}: token ids must be in [0, {vocab})")
        limit = self.limits.max_seq_len
        if len(ids) >= limit:
            what = ("larger than the KV pool" if self.limits.kv_capacity <= self.limits.context_len
                    else "longer than the context length")
            raise ValueError(f"{name}: the prompt has {len(ids)} tokens; at most {limit - 1} fit, {what} "
                             f"(context length {self.limits.context_len}, KV pool {self.limits.kv_capacity} tokens)")

    def sampling(self, params: ParamsIn) -> SamplingParams:
        """Parse and validate one prompt's parameters: ``verify`` once, the constraint once.
        A SamplingParams passed in is copied, never mutated."""
        if isinstance(params, SamplingParams):
            sp = SamplingParams(**params.__dict__)
        elif params is None or isinstance(params, dict):
            sp = SamplingParams.from_dict(params)
        else:
            raise ValueError("sampling_params: must be a mapping of sampling parameters")
        verify_sampling(sp, self.limits.vocab_size, self.grammar_backend)
        return sp

    def clamp(self, sp: SamplingParams, prompt_len: int, return_logprob: bool,
              logprob_start_len: int) -> tuple[SamplingParams, int]:
        """A copy with n == 1 and max/min_new_tokens fitted to the room left; the clamped start."""
        one = SamplingParams(**{**sp.__dict__, "n": 1})
        one.max_new_tokens = min(one.max_new_tokens, self.limits.max_seq_len - prompt_len)
        one.min_new_tokens = min(one.min_new_tokens, one.max_new_tokens)
        if return_logprob and logprob_start_len >= 0:
            logprob_start_len = min(logprob_start_len, prompt_len - 1)
        return one, logprob_start_len

    def build(self, prompts: list[list[int]], params: list[ParamsIn], names: list[str],
              rids: Optional[list[str]] = None, return_logprob: bool = False, logprob_start_len: int = -1,
              top_logprobs_num: int = 0, in_use: Callable[[str], bool] = lambda rid: False
              ) -> list[TokenizedRequest]:
        """Validate and expand; copy j of an n > 1 prompt with rid ``r`` is ``r-j`` with seed + j.
        ``in_use(rid)`` tells which given rids are taken.  Raises ValueError naming the field."""
        if logprob_start_len < -1:
            raise ValueError("logprob_start_len: must be >= -1")
        if not isinstance(top_logprobs_num, int) or not 0 <= top_logprobs_num <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top_logprobs_num: must be in [0, {MAX_TOP_LOGPROBS}]")
        if len(params) != len(prompts):
            raise ValueError("sampling_params: a list must have one entry per prompt")
        if rids is not None and len(rids) != len(prompts):
            raise ValueError("rid: a list must have one entry per prompt")
        out: list[TokenizedRequest] = []
        taken: set[str] = set()
        for i, (ids, p, name) in enumerate(zip(prompts, params, names)):
            self.check_prompt(ids, name)
            sp = self.sampling(p)
            if len(out) + sp.n > MAX_SEQUENCES:
                raise ValueError(f"sampling_params.n: at most {MAX_SEQUENCES} sequences per request (prompts x n)")
            one, start = self.clamp(sp, len(ids), return_logprob, logprob_start_len)
            base = rids[i] if rids is not None else new_rid()
            for j in range(sp.n):
                rid = base if sp.n == 1 else f"{base}-{j}"
                if rid in taken or in_use(rid):
                    raise ValueError(f"rid: {rid!r} is already in use")
                taken.add(rid)
                params = one if sp.n == 1 else SamplingParams(**one.__dict__)
                seed = None if sp.seed is None else sp.seed + j
                out.append(TokenizedRequest(rid, list(ids), params, seed, return_logprob, start, top_logprobs_num,
                                            copy=j))
        return out

    def build_embed(self, prompts: list[list[int]], names: list[str], pooling: str,
                    rids: Optional[list[str]] = None) -> list[TokenizedRequest]:
        """Embedding requests (prefill only: ``max_new_tokens`` 0) pooled with ``pooling``;
        raises ValueError naming the bad prompt's field or ``pooling``."""
        check_pooling(pooling)
        if not prompts:
            raise ValueError(f"{names[0] if names else 'input'}: the batch is empty")
        if len(prompts) > MAX_SEQUENCES:
            raise ValueError(f"input: at most {MAX_SEQUENCES} inputs per request")
        out = []
        for i, (ids, name) in enumerate(zip(prompts, names)):
            self.check_prompt(ids, name)
            rid = rids[i] if rids is not None else new_rid()
            out.append(TokenizedRequest(rid, list(ids), SamplingParams(max_new_tokens=0), pooling=pooling))
        return out
