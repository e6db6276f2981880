"""The one front door for requests: validation, clamping and n-expansion, done once.

Used by the in-process ``Engine`` (and through it by ``frontend_lang``) and by the server's
/generate route and ``TokenizerManager``.  ``split_prompts`` turns a raw request (text,
input_ids or segments, single or batched, one or per-prompt sampling parameters) into per-prompt
pieces (``segments`` mark documents: radixserve/tokenizer.py);
``RequestBuilder.build`` turns those prompts (token ids) with their sampling
parameters into single sequences (``TokenizedRequest``, n == 1), against the ``Limits`` the
model worker reported.  Per prompt it calls ``SamplingParams.verify`` exactly once and checks
a constraint (regex / json_schema / choices) once; every copy of an ``n > 1`` prompt gets
``seed + i``.  Errors are ``ValueError`` whose message starts with the field's name (the server
turns them into 400s).  Nothing downstream (scheduler) validates again.

This module stays light (no torch): the server process imports it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

from radixserve.config import DEFAULT_GRAMMAR_BACKEND
from radixserve.constrained.schema.spec import constraint_of
from radixserve.embedding import check_pooling
from radixserve.ipc.server_link import TokenizedRequest
from radixserve.ipc.worker_link import WorkerInfo
from radixserve.sampling_params import MAX_CACHE_SALT_LEN, SamplingParams
from radixserve.tokenizer import Encode, Spans, check_spans, split_segments
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


@dataclass
class Prompts:
    """One raw request, per prompt: token ids, sampling parameters, field names for errors
    ("text", "input_ids.1", ...), request ids (None: fresh ones), whether the input was a
    batch (the result is then a list), and the document spans of each prompt (None: no prompt
    has documents)."""

    ids: list[list[int]]
    params: list[ParamsIn]
    names: list[str]
    rids: Optional[list[str]]
    batched: bool
    spans: Optional[list[Optional[Spans]]] = None


def split_prompts(text: Union[str, list[str], None], input_ids: Any, sampling_params: Union[ParamsIn, list],
                  encode: Callable[[str], list[int]], rid: Union[str, list[str], None] = None,
                  priority: Optional[int] = None, cache_salt: Optional[str] = None,
                  allow_empty: bool = False, lora_path: Union[str, list, None] = None,
                  segments: Any = None, encode_plain: Optional[Encode] = None,
                  require_reasoning: bool = False) -> Prompts:
    """Split a raw request: exactly one of ``text`` (a string or a list, each run through
    ``encode``), ``input_ids`` (a list of ints or a list of them) and ``segments`` (one prompt's
    list of segments or a list of them, encoded by ``radixserve.tokenizer.split_segments`` with
    ``encode`` and ``encode_plain``, the same tokenizer without special tokens; their document
    spans go to ``Prompts.spans``); ``sampling_params`` one entry for all prompts or a list with
    one per prompt.  ``priority`` / ``cache_salt`` / ``require_reasoning`` when true (the
    top-level fields of /generate) go into every prompt's (mapping) parameters, ``lora_path`` too
    (SGLang's: one adapter name for all prompts, or a list with one name or None per prompt); a string
    ``rid`` of a batch becomes ``rid-i``.  An empty batch is an error unless ``allow_empty``.
    Prompt contents are checked later, by ``RequestBuilder.build``.  Raises ValueError naming
    the field."""
    spans = None
    if segments is not None:
        if text is not None or input_ids is not None:
            raise ValueError("segments: give exactly one of text, input_ids and segments")
        if encode_plain is None:
            raise ValueError("segments: not supported here")
        field = "segments"
        ids_list, spans_list, batched = split_segments(segments, encode, encode_plain)
        spans = spans_list if any(sp is not None for sp in spans_list) else None
    elif (text is None) == (input_ids is None):
        raise ValueError("text: give exactly one of prompt text or input_ids")
    elif text is not None:
        field, batched = "text", isinstance(text, list)
        texts = text if batched else [text]
        if not all(isinstance(t, str) for t in texts):
            raise ValueError("text: must be a string or a list of strings")
        ids_list = [encode(t) for t in texts]
    else:
        field = "input_ids"
        batched = isinstance(input_ids, (list, tuple)) and bool(input_ids) and isinstance(input_ids[0], list)
        ids_list = list(input_ids) if batched else [input_ids]
        if not all(isinstance(ids, (list, tuple)) and all(isinstance(t, int) for t in ids) for ids in ids_list):
            raise ValueError("input_ids: must be a list of ints or a list of lists of ints")
    if not ids_list and not allow_empty:
        raise ValueError(f"{field}: the batch is empty")
    if isinstance(sampling_params, list):
        if len(sampling_params) != len(ids_list):
            raise ValueError("sampling_params: a list must have one entry per prompt")
    else:
        sampling_params = [sampling_params] * len(ids_list)
    params = [{} if p is None else p for p in sampling_params]
    if priority is not None:
        params = _set_everywhere(params, "priority", priority)
    if cache_salt is not None:
        if not 0 < len(cache_salt) <= MAX_CACHE_SALT_LEN:
            raise ValueError(f"cache_salt: must be a non-empty string of at most {MAX_CACHE_SALT_LEN} characters")
        params = _set_everywhere(params, "cache_salt", cache_salt)
    if require_reasoning:
        params = _set_everywhere(params, "require_reasoning", True)
    if isinstance(lora_path, list):
        if len(lora_path) != len(params):
            raise ValueError("lora_path: a list must have one entry per prompt")
        params = [_set_everywhere([p], "lora_path", name)[0] if name is not None else p
                  for p, name in zip(params, lora_path)]
    elif lora_path is not None:
        params = _set_everywhere(params, "lora_path", lora_path)
    rids = rid
    if isinstance(rid, str):
        rids = [f"{rid}-{i}" for i in range(len(ids_list))] if batched else [rid]
    names = [f"{field}.{i}" if batched else field for i in range(len(ids_list))]
    return Prompts(ids_list, params, names, rids, batched, spans)


def _set_everywhere(params: list[ParamsIn], name: str, value: Any) -> list[ParamsIn]:
    """Each mapping of ``params`` with ``name`` set to ``value``; ValueError (naming ``name``)
    where one already sets another value or is not a mapping."""
    if not all(isinstance(p, dict) for p in params):
        raise ValueError(f"{name}: give it inside sampling_params when they are not mappings")
    if any(p.get(name, value) != value for p in params):
        raise ValueError(f"{name}: differs from sampling_params.{name}; give it once")
    return [{**p, name: value} for p in params]


class RequestBuilder:
    """Stateless apart from its limits; safe to call from any thread.  ``grammar_backend`` is
    the scheduler's (``SchedulerConfig.grammar_backend``): constraints are validated as it
    will compile them; ``reasoning_parser`` too ("none": a request that thinks is refused)."""

    def __init__(self, limits: Limits, grammar_backend: str = DEFAULT_GRAMMAR_BACKEND, lora: Any = None,
                 reasoning_parser: str = "none") -> None:
        """``lora``: the served adapters (``lora.registry.LoRARegistry``; None: none), against
        which ``lora_path`` is resolved to the adapter's uid."""
        self.limits = limits
        self.grammar_backend = grammar_backend
        self.lora = lora
        self.reasoning_parser = reasoning_parser

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
        if sp.require_reasoning and self.reasoning_parser == "none":
            raise ValueError("require_reasoning: this server has no reasoning parser (start it with "
                             "--reasoning-parser)")
        if sp.lora_path is not None:
            if self.lora is None:
                raise ValueError("lora_path: LoRA adapters are not enabled on this server (start it with "
                                 "--enable-lora or --lora-paths)")
            sp.lora_path = self.lora.resolve(sp.lora_path)
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
              top_logprobs_num: int = 0, in_use: Callable[[str], bool] = lambda rid: False,
              doc_spans: Optional[list[Optional[Spans]]] = None) -> list[TokenizedRequest]:
        """Validate and expand; copy j of an n > 1 prompt with rid ``r`` is ``r-j`` with seed + j.
        ``in_use(rid)`` tells which given rids are taken.  ``doc_spans``: each prompt's document
        spans (``Prompts.spans``; None: no documents), carried by every copy.  Raises ValueError
        naming the field."""
        if logprob_start_len < -1:
            raise ValueError("logprob_start_len: must be >= -1")
        if not isinstance(top_logprobs_num, int) or not 0 <= top_logprobs_num <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top_logprobs_num: must be in [0, {MAX_TOP_LOGPROBS}]")
        if len(params) != len(prompts):
            raise ValueError("sampling_params: a list must have one entry per prompt")
        if rids is not None and len(rids) != len(prompts):
            raise ValueError("rid: a list must have one entry per prompt")
        if doc_spans is not None and len(doc_spans) != len(prompts):
            raise ValueError("segments: one list of document spans per prompt")
        out: list[TokenizedRequest] = []
        taken: set[str] = set()
        for i, (ids, p, name) in enumerate(zip(prompts, params, names)):
            self.check_prompt(ids, name)
            spans = doc_spans[i] if doc_spans is not None else None
            check_spans(spans, len(ids), name)
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
                                            copy=j, doc_spans=None if spans is None else [tuple(x) for x in spans]))
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
