"""The worker link: typed messages between the scheduler and the model worker.

A step message is O(new tokens): the worker keeps its own request->token table and its
own per-request sampling state, so the scheduler only sends the slots it just allocated.
``prefix_slots`` travels once, when a request (re)enters the worker, and ``init`` carries
the request's sampling parameters at the same time.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from radixserve.sampling_params import SamplingParams

if TYPE_CHECKING:  # the arrays' type only: the detokenizer never loads numpy
    import numpy as np


@dataclass
class ReqInit:
    """Sent with a request's first step on a worker."""

    sampling: SamplingParams
    seed: Optional[int]
    # token ids the penalties look at (prompt + outputs so far); only when penalties are on
    penalty_prompt_ids: Optional[list[int]] = None
    penalty_output_ids: Optional[list[int]] = None
    eos_ids: tuple[int, ...] = ()


@dataclass
class StepReq:
    rid: str
    row: int  # row of the request->token table
    start: int  # KV tokens already in the row == position of the first new token
    input_ids: np.ndarray  # int64 [n] new tokens
    slots: np.ndarray  # int64 [n] their KV slots
    sample: bool  # sample a next token at the last new position
    num_output: int = 0  # tokens generated so far (seed stepping, min_new_tokens)
    prefix_slots: Optional[np.ndarray] = None  # slots of positions [0, start), when (re)entering
    init: Optional[ReqInit] = None
    # prompt logprobs: rows [logprob_from, n) of this chunk, scored against ``logprob_targets``
    # (-1 for the last row when it is the sampled position)
    logprob_from: int = -1
    logprob_targets: Optional[np.ndarray] = None
    return_logprob: bool = False
    top_logprobs_num: int = 0
    # bool [vocab] allowed tokens (constrained decoding); [num_draft + 1, vocab] when speculating
    vocab_mask: Optional[np.ndarray] = None
    # speculative decoding: the last ``num_draft`` of ``input_ids`` are proposed tokens to verify
    # (``sample`` is then True); the reply's ``spec_ids`` are those accepted, ``next_token`` the
    # target's own token after them (radixserve/speculative/verify.py)
    num_draft: int = 0
    draft_by_worker: bool = False  # the worker's draft model writes the proposed tokens first
    # embeddings: "last" returns the final (normed) hidden state of this chunk's last row,
    # "sum" the fp32 sum over its rows, in ``StepOutput.hidden``; "" (generation) neither
    pool: str = ""
    # the sliding-window pool (``mem_cache/swa_slots.py``): the sliding slot of each of ``slots``
    # and of ``prefix_slots`` (0: freed, never read); None without one
    swa_slots: Optional[np.ndarray] = None
    prefix_swa: Optional[np.ndarray] = None
    # order-free document reuse (scheduler/documents.py): ``compute`` lists the indices into this
    # window (``input_ids``/``slots``, positions ``start + i``) whose tokens the step computes
    # (None: all); the others' KV is copied first from the document slots ``reuse_src`` into
    # ``reuse_dst`` with the keys' rotary positions moved by ``reuse_shift`` (worker/doc_kv.py)
    compute: Optional[np.ndarray] = None
    reuse_src: Optional[np.ndarray] = None
    reuse_dst: Optional[np.ndarray] = None
    reuse_shift: Optional[np.ndarray] = None
    # "deviation": ``compute`` may overlap ``reuse_dst`` (candidates the scheduler would compute);
    # the worker may compute other candidates instead, as many, by their layer-1 K/V deviation
    # (worker/doc_select.py); the indices outside ``reuse_dst`` stay computed.  "first": as given
    doc_select: str = "first"


@dataclass
class StepPlan:
    decode: bool
    reqs: list[StepReq]
    release: list[str] = field(default_factory=list)  # rids whose worker state can go


@dataclass
class TokenLogprob:
    logprob: float
    token_id: int
    top: Optional[list[tuple[float, int]]] = None


@dataclass
class StepOutput:
    rid: str
    next_token: Optional[int] = None
    next_logprob: Optional[TokenLogprob] = None
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)
    spec_ids: list[int] = field(default_factory=list)  # accepted proposed tokens, before next_token
    spec_logprobs: list[TokenLogprob] = field(default_factory=list)  # theirs, when return_logprob
    hidden: Optional[np.ndarray] = None  # float32 [hidden_size] when the StepReq asked to ``pool``


@dataclass
class StepResult:
    outputs: list[StepOutput]


@dataclass
class WorkerInfo:
    """What the model worker tells the scheduler (and, through it, the server) once loaded."""

    num_slots: int
    max_rows: int
    context_len: int
    vocab_size: int
    dtype: str
    device: str
    hf_dir: str
    quantization: str = "none"  # of the decoder's linear layers, e.g. "int8 at <= 4 rows"
    hidden_size: int = 0  # the length of an embedding
    kv_bytes_per_slot: int = 0  # K and V of one token over all layers (warm restart's byte budget)
    swa_slots: int = 0  # slots of the sliding-window pool (0: none; mem_cache/swa_slots.py)
    swa_window: int = 0  # the longest sliding window it serves
    host_tier_slots: int = 0  # token slots of the hierarchical cache's host tier (0: off)
    lora: Any = None  # ipc.lora_link.LoRAWorkerInfo when LoRA adapters are served
    # why reused documents cannot be placed at other positions here (None: they can; worker/doc_kv.py)
    doc_reuse_refusal: Optional[str] = None
