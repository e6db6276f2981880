"""Scheduler-side state of one request."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from radixserve.constrained.runtime.fsm_state import GrammarState
from radixserve.ipc.worker_link import TokenLogprob
from radixserve.mem_cache.tree_node import TreeNode
from radixserve.request import FinishReason, ReqStatus
from radixserve.sampling_params import SamplingParams


@dataclass
class Req:
    """One request as the scheduler sees it; only the thread that drives the scheduler writes it.

    KV bookkeeping (``row``, ``cached_len`` and ``last_node`` are written by ``KVManager`` only;
    the scheduler advances ``kv_len`` after each step): ``row`` is the request's row of slots;
    ``row[:kv_len]`` hold computed KV; ``row[:cached_len]`` are owned by the prefix cache and
    locked through ``last_node``; ``row[cached_len:kv_len]`` are held by this request alone.

    Output bookkeeping (``scheduler/outputs.py``): ``sent_ids``/``sent_lps`` count the output
    tokens / logprobs already sent; ``arrival`` is when the scheduler received it
    (``time.perf_counter``), ``queue_time`` the wait until its first step, reported once with
    the first output (``started``)."""

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
    resync: bool = False  # the row was rewritten: the next step resends the worker's copy
    grammar: Optional[GrammarState] = None  # set once the request's grammar is compiled
    arrival: Optional[float] = None
    queue_time: Optional[float] = None
    started: bool = False
    sent_ids: int = 0
    sent_lps: int = 0
    spec_state: Any = None  # the speculator's per-request state (radixserve/speculative/strategy.py)
    spec_proposed: int = 0  # proposed tokens verified so far
    spec_accepted: int = 0  # of which the target accepted
    pooling: Optional[str] = None  # an embedding request: "last" / "mean" (scheduler/pooling.py)
    pooled: Any = None  # its pooled hidden state so far (float32 numpy)
    sent_input_lps: int = -1  # prompt logprobs sent (with the first output), -1 before
    # order-free document reuse (scheduler/documents.py): the prompt's document spans (start, end),
    # what was reused / recomputed of them, and why they ran as exact prefill instead (None: they did not)
    doc_spans: Optional[list[tuple[int, int]]] = None
    doc_reused: int = 0
    doc_recomputed: int = 0
    doc_fallback: Optional[str] = None
    doc: Any = None  # the placement state (scheduler/documents.py), None when nothing is placed
    internal: bool = False  # computes a document for other requests: no output, no hooks

    @property
    def fill_ids(self) -> list[int]:
        return self.input_ids + self.output_ids

    @property
    def fill_len(self) -> int:
        return len(self.input_ids) + len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def cache_salt(self) -> Optional[str]:
        """The request's prefix-cache namespace: requests with different salts share no KV.  A
        LoRA adapter (its uid: name and content) is part of it, as a salt is."""
        lora = self.sampling.lora_path
        if lora is None:
            return self.sampling.cache_salt
        return f"lora\x00{lora}" + ("" if self.sampling.cache_salt is None else f"\x00{self.sampling.cache_salt}")

    @property
    def lora(self) -> Optional[str]:
        """The uid of the request's LoRA adapter (None: the base model)."""
        return self.sampling.lora_path

    def remaining_new_tokens(self) -> int:
        return max(0, self.sampling.max_new_tokens - len(self.output_ids))

    def prefix_match_limit(self) -> int:
        """How many leading tokens may come from the cache: at least one token is always
        recomputed (its logits give the next token), and prompt logprobs from
        ``logprob_start_len`` need the logits of the position before it."""
        if self.pooling == "mean":
            return 0  # every position's hidden state is needed (scheduler/pooling.py)
        limit = self.fill_len - 1
        if self.return_logprob and self.logprob_start_len >= 0 and not self.input_logprobs:
            limit = min(limit, max(0, self.logprob_start_len - 1))
        return max(0, limit)
