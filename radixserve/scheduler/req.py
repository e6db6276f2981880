"""Scheduler-side state of one request."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Optional

from radixserve.ipc.messages import TokenLogprob
from radixserve.mem_cache.radix_cache import TreeNode
from radixserve.sampling_params import SamplingParams


class FinishReason(dict):
    """SGLang's finish_reason shape: {type: stop|length|abort, matched|length|message}."""

    @classmethod
    def stop(cls, matched: Any) -> "FinishReason":
        return cls(type="stop", matched=matched)

    @classmethod
    def length(cls, length: int) -> "FinishReason":
        return cls(type="length", length=length)

    @classmethod
    def abort(cls, message: str) -> "FinishReason":
        return cls(type="abort", message=message)


class ReqStatus(enum.Enum):
    WAITING = 1
    RUNNING = 2
    FINISHED = 3


@dataclass
class Req:
    """KV bookkeeping: ``row[:kv_len]`` hold computed KV; ``row[:cached_len]`` are owned by the
    radix tree and locked through ``last_node``; ``row[cached_len:kv_len]`` are held by this
    request alone."""

    rid: str
    input_ids: list[int]
    sampling: SamplingParams
    seed: Optional[int] = None
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    output_ids: list[int] = field(default_factory=list)
    status: ReqStatus = ReqStatus.WAITING
    row: Optional[int] = None
    kv_len: int = 0
    cached_len: int = 0
    last_node: Optional[TreeNode] = None
    on_worker: bool = False
    cached_tokens: int = 0  # cache hit reported in meta_info (first admission)
    admitted_once: bool = False
    finish_reason: Optional[FinishReason] = None
    stop_str_end: Optional[int] = None  # text length cut for a matched stop string
    input_logprobs: list[Optional[TokenLogprob]] = field(default_factory=list)
    output_logprobs: list[TokenLogprob] = field(default_factory=list)
    retractions: int = 0
    extra: dict = field(default_factory=dict)  # front-end data carried along (e.g. arrival time)
    grammar: Optional[Any] = None  # constrained.fsm_state.GrammarState once the grammar is compiled

    @property
    def fill_ids(self) -> list[int]:
        return self.input_ids + self.output_ids

    @property
    def fill_len(self) -> int:
        return len(self.input_ids) + len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def remaining_new_tokens(self) -> int:
        return max(0, self.sampling.max_new_tokens - len(self.output_ids))

    def prefix_match_limit(self) -> int:
        """How many leading tokens may come from the cache: at least one token is always
        recomputed (its logits give the next token), and prompt logprobs from
        ``logprob_start_len`` need the logits of the position before it."""
        limit = self.fill_len - 1
        if self.return_logprob and self.logprob_start_len >= 0 and not self.input_logprobs:
            limit = min(limit, max(0, self.logprob_start_len - 1))
        return max(0, limit)
