"""The server's request link: typed messages server -> scheduler -> detokenizer -> server.

Flow: server --TokenizedRequest/AbortReq/ControlReq--> scheduler --BatchReqOutput-->
detokenizer --BatchReqOutput (text filled in)--> server.  The detokenizer forwards every
other message (ControlReply, SchedulerStats, ReqError) unchanged, so the server reads
one socket.  Outputs are deltas: new token ids and new text since the previous message.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from radixserve.ipc.worker_link import TokenLogprob
from radixserve.sampling_params import SamplingParams

if TYPE_CHECKING:  # the array's type only: the detokenizer never loads numpy
    import numpy as np


@dataclass
class TokenizedRequest:
    """One sequence to generate (the server expands batches and n > 1 into these)."""

    rid: str
    input_ids: list[int]
    sampling: SamplingParams  # n == 1 here
    seed: Optional[int] = None
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    pooling: Optional[str] = None  # an embedding request ("last" / "mean", prefill only); None: generate
    copy: int = 0  # which copy of its prompt (n > 1) this sequence is: the prompt is charged once
    # the documents of the prompt (radixserve/tokenizer.py): (start, end) token ranges of ``input_ids``,
    # sorted, non-overlapping and non-empty; None: no documents (exact prefix semantics throughout)
    doc_spans: Optional[list[tuple[int, int]]] = None


@dataclass
class AbortReq:
    rid: str
    message: str = "aborted by client"


@dataclass
class ControlReq:
    """``kind``: "flush_cache", "stats", "stats+check", or the inspector's "cache_tree"
    (``args``: max_depth, max_nodes, with_tokens) and "cache_stats"; answered by a ControlReply
    with the same id (its payload ``{"error": ...}`` for an unknown kind or bad ``args``)."""

    req_id: str
    kind: str
    args: dict[str, Any] = field(default_factory=dict)


@dataclass
class ControlReply:
    req_id: str
    payload: Any


@dataclass
class ReqError:
    """The scheduler refused a request.  ``status`` is the HTTP status to report
    (400: invalid, 503: queue full, 500: internal error)."""

    rid: str
    status: int
    message: str


@dataclass
class SchedulerStats:
    running: int
    waiting: int
    num_slots: int
    free_slots: int
    cache_size: int
    hit_rate: float


@dataclass
class ReqOutput:
    """Progress of one request since its previous ReqOutput.

    The scheduler fills the token fields; the detokenizer fills ``text`` (new readable
    text, stop-string-safe) and, on the final message, ``final_text`` (the whole output
    text with any stop string trimmed).
    """

    rid: str
    new_ids: list[int]
    finish_reason: Optional[dict] = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    document_reused_tokens: int = 0  # document tokens whose KV was reused out of order (issue 46)
    document_recomputed_tokens: int = 0  # document tokens recomputed to repair the reused KV
    document_fallback: Optional[str] = None  # why the documents ran as exact prefill instead (None: they did not)
    completion_tokens: int = 0
    queue_time: Optional[float] = None  # seconds waited before the first admission (first message)
    spec_proposed: int = 0  # speculative decoding: proposed tokens verified so far (cumulative)
    spec_accepted: int = 0  # of which the target accepted (cumulative)
    new_output_logprobs: list[TokenLogprob] = field(default_factory=list)
    input_logprobs: Optional[list[Optional[TokenLogprob]]] = None  # first and final message
    embedding: Optional[np.ndarray] = None  # float32, pooled (not normalized); final message of an embedding
    skip_special_tokens: bool = True
    stop_strs: tuple[str, ...] = ()
    stop_regex: tuple[str, ...] = ()
    no_stop_trim: bool = False
    text: str = ""
    final_text: Optional[str] = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class BatchReqOutput:
    outputs: list[ReqOutput]
