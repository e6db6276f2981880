"""Sampling parameters of one request, with validation that names the bad field."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable, Optional, Union

import regex


# Stop strings and stop regexes are matched on the output at every step (and partial regex
# matches searched for in the detokenizer): bound their number and size, and every search.
MAX_STOPS = 128
MAX_STOP_LEN = 1024
MAX_STOP_REGEX_LEN = 256  # partial matching of longer literals takes seconds (regex ignores its timeout there)
STOP_REGEX_TIMEOUT_S = 0.1
MAX_CACHE_SALT_LEN = 256
# the regex module unrolls repeat minimums when compiling ("a{2147483648}" allocates tens of
# GB; nested ones multiply): bound their product, counted as if every repeat were nested
MAX_STOP_REGEX_REPEAT = 10_000
_REPEAT = regex.compile(r"\{(\d+)(?:,\d*)?\}")


def _repeat_product(pattern: str) -> int:
    product = 1
    for m in _REPEAT.finditer(pattern):
        digits = m.group(1)
        product *= MAX_STOP_REGEX_REPEAT + 1 if len(digits) > 6 else max(1, int(digits))
        if product > MAX_STOP_REGEX_REPEAT:
            break
    return product


def search_stop_regex(pattern: str, text: str, **kw: Any) -> Optional["regex.Match[str]"]:
    """``regex.search`` bounded to ``STOP_REGEX_TIMEOUT_S``; raises TimeoutError past it (a
    pattern that backtracks catastrophically on this text)."""
    return regex.search(pattern, text, timeout=STOP_REGEX_TIMEOUT_S, **kw)


def check_stop_regex(patterns: list[str], bad: Callable[[str], None]) -> None:
    """Call ``bad(reason)`` unless ``patterns`` are non-empty strings that compile as regexes."""
    if not all(isinstance(p, str) and p for p in patterns):
        bad("must be a non-empty regex or a list of non-empty regexes")
    if len(patterns) > MAX_STOPS or any(len(p) > MAX_STOP_REGEX_LEN for p in patterns):
        bad(f"at most {MAX_STOPS} patterns of at most {MAX_STOP_REGEX_LEN} characters")
    if any(_repeat_product(p) > MAX_STOP_REGEX_REPEAT for p in patterns):
        bad(f"repeat counts too large (their product must stay under {MAX_STOP_REGEX_REPEAT})")
    for p in patterns:
        try:
            regex.compile(p)
        except regex.error as e:
            bad(f"invalid regex {p!r}: {e}")


@dataclass
class SamplingParams:
    """SGLang-compatible sampling parameters.

    temperature 0 means greedy.  top_k -1 (or 0) means no top-k cut.  ``stop`` strings are
    trimmed from the returned text; ``stop_token_ids`` end generation on those ids (kept in
    ``output_ids``).  ``seed`` makes sampling reproducible per request independent of batch
    composition; with ``n > 1`` copy ``i`` uses ``seed + i``.  ``regex``, ``json_schema`` (a
    JSON string or an object), ``choices`` (a list of strings) or ``ebnf`` (a grammar: Lark,
    or GBNF ``root ::= ...`` as SGLang/xgrammar take it; needs the llguidance grammar backend)
    constrain the output to match fully; an invalid or unsupported one raises ValueError
    with the parser's message.

    Every field of SGLang's ``sampling_params`` (0.5.10) is here, so SGLang clients work:
    ``stop_regex`` (a regex or a list) ends generation when the decoded output matches one
    (finish_reason ``{"type": "stop", "matched": <the pattern>}``) and, like a stop string,
    is trimmed from the text unless ``no_stop_trim``; ``sampling_seed`` is SGLang's name for
    ``seed``.  Accepted and ignored: ``custom_params`` (only read by a custom logit
    processor, which is refused at the request level), ``stream_interval`` (every step is
    streamed) and ``spaces_between_special_tokens`` (see ``IncrementalDecoder``).  Refused
    when set (ValueError naming the field): ``structural_tag``.

    ``priority`` (an int, default 0) is the one scheduling field: higher is admitted first
    (``scheduler/policy.py``).  It lives here because every front end (native, OpenAI,
    ``frontend_lang``, ``Engine``) derives its request fields from this class; SGLang's
    top-level ``priority`` of /generate maps onto it.

    ``cache_salt`` (vLLM's name; a non-empty string of at most 256 characters) puts the
    request in its own prefix-cache namespace: requests with different salts never share KV,
    so one cannot time another's cache hits.  Also top-level on /generate and the OpenAI
    bodies.  In multi-key mode the server prefixes it with the key's salt
    (``server/tenancy/accounting.py``), so a tenant can never enter another's namespace.

    ``lora_path`` (SGLang's name) is the name of a loaded LoRA adapter to generate with (None:
    the base model; docs/LORA.md); the request builder resolves it to the adapter's uid (name and
    content), which is also the request's prefix-cache namespace beside ``cache_salt``.

    ``document_recompute`` (0 to 1; None: the server's ``--document-recompute``) is the share of
    the tokens of a prompt's documents (``segments`` marked ``document``, radixserve/tokenizer.py)
    recomputed when their cached KV is reused at another position; it changes nothing for a
    prompt without documents.  ``document_select`` ("first" or "deviation"; None: the server's
    ``--document-select``) says which of those tokens: each document's first, or those whose
    layer-1 K/V deviate most from the reused KV (docs/DOCUMENTS.md).

    Reasoning models (docs/REASONING.md; the server's ``--reasoning-parser``): ``require_reasoning``
    (SGLang's field) says the output starts inside the model's thinking block, so a constraint
    (regex, json_schema, choices, ebnf) applies only after the think-end token; the chat route sets
    it from the chat template's thinking switch.  ``thinking_token_budget`` (vLLM's name; an int
    >= 0, with ``require_reasoning``) forces the think-end token after that many thinking tokens.
    """

    max_new_tokens: int = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    stop: Union[str, list[str], None] = None
    stop_token_ids: Optional[list[int]] = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    logit_bias: Optional[dict[int, float]] = None
    seed: Optional[int] = None
    n: int = 1
    # structured generation (radixserve/constrained): at most one of these
    regex: Optional[str] = None
    json_schema: Union[str, dict, None] = None
    choices: Optional[list[str]] = None
    # what a constrained output does at max_new_tokens: "cut" (stop where it stands) or "close"
    # (near the end, steer to its shortest valid ending: constrained/schema/budget.py)
    constraint_budget: str = "cut"
    # SGLang fields (see the class docstring)
    stop_regex: Union[str, list[str], None] = None
    no_stop_trim: bool = False
    sampling_seed: Optional[int] = None
    custom_params: Optional[dict[str, Any]] = None
    stream_interval: Optional[int] = None
    ebnf: Optional[str] = None  # structured generation too (SGLang's name)
    structural_tag: Optional[str] = None
    priority: int = 0
    cache_salt: Optional[str] = None
    lora_path: Optional[str] = None
    document_recompute: Optional[float] = None
    document_select: Optional[str] = None
    require_reasoning: bool = False
    thinking_token_budget: Optional[int] = None

    @classmethod
    def from_dict(cls, d: Optional[dict[str, Any]]) -> "SamplingParams":
        d = dict(d or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"sampling_params.{unknown[0]}: unknown sampling parameter")
        return cls(**d)

    @property
    def stop_strs(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def stop_regex_strs(self) -> list[str]:
        if self.stop_regex is None:
            return []
        return [self.stop_regex] if isinstance(self.stop_regex, str) else list(self.stop_regex)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    def needs_penalty(self) -> bool:
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0

    def verify(self, vocab_size: int) -> None:
        """Raise ValueError naming the first invalid field."""

        def bad(name: str, why: str) -> None:
            got = repr(getattr(self, name))
            raise ValueError(f"sampling_params.{name}: {why} (got {got[:200]}{'...' if len(got) > 200 else ''})")

        def is_int(x: Any) -> bool:
            return isinstance(x, int) and not isinstance(x, bool)

        def is_num(x: Any) -> bool:
            return isinstance(x, (int, float)) and not isinstance(x, bool)

        for name in ("max_new_tokens", "min_new_tokens", "top_k", "n", "priority"):
            if not is_int(getattr(self, name)):
                bad(name, "must be an integer")
        for name in ("temperature", "top_p", "min_p", "repetition_penalty", "frequency_penalty", "presence_penalty"):
            if not is_num(getattr(self, name)):
                bad(name, "must be a number")
        if self.max_new_tokens < 0:
            bad("max_new_tokens", "must be >= 0")
        if self.min_new_tokens < 0 or self.min_new_tokens > self.max_new_tokens:
            bad("min_new_tokens", "must be in [0, max_new_tokens]")
        if self.temperature < 0:
            bad("temperature", "must be >= 0")
        if not 0.0 < self.top_p <= 1.0:
            bad("top_p", "must be in (0, 1]")
        if self.top_k < -1:
            bad("top_k", "must be -1 (disabled) or >= 1")
        if not 0.0 <= self.min_p <= 1.0:
            bad("min_p", "must be in [0, 1]")
        if self.repetition_penalty <= 0:
            bad("repetition_penalty", "must be > 0")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            bad("frequency_penalty", "must be in [-2, 2]")
        if not -2.0 <= self.presence_penalty <= 2.0:
            bad("presence_penalty", "must be in [-2, 2]")
        if self.n < 1:
            bad("n", "must be >= 1")
        if self.seed is not None and not is_int(self.seed):
            bad("seed", "must be an integer")
        if self.stop is not None:
            stops = self.stop_strs
            if not all(isinstance(s, str) and s for s in stops):
                bad("stop", "must be a non-empty string or a list of non-empty strings")
            if len(stops) > MAX_STOPS or any(len(s) > MAX_STOP_LEN for s in stops):
                bad("stop", f"at most {MAX_STOPS} strings of at most {MAX_STOP_LEN} characters")
        if self.stop_regex is not None:
            check_stop_regex(self.stop_regex_strs, lambda why: bad("stop_regex", why))
        if self.sampling_seed is not None:
            if not is_int(self.sampling_seed):
                bad("sampling_seed", "must be an integer")
            if self.seed is not None and self.seed != self.sampling_seed:
                bad("sampling_seed", "differs from seed (sampling_seed is SGLang's name for seed)")
            self.seed, self.sampling_seed = self.sampling_seed, None  # normalized: verify stays idempotent
        if self.stream_interval is not None and not (is_int(self.stream_interval) and self.stream_interval >= 1):
            bad("stream_interval", "must be an integer >= 1")
        if self.custom_params is not None and not isinstance(self.custom_params, dict):
            bad("custom_params", "must be an object")
        if self.cache_salt is not None and not (isinstance(self.cache_salt, str)
                                                and 0 < len(self.cache_salt) <= MAX_CACHE_SALT_LEN):
            bad("cache_salt", f"must be a non-empty string of at most {MAX_CACHE_SALT_LEN} characters")
        if self.lora_path is not None and not (isinstance(self.lora_path, str) and self.lora_path):
            bad("lora_path", "must be the name of a loaded adapter")
        if self.document_recompute is not None and not (is_num(self.document_recompute)
                                                        and 0.0 <= self.document_recompute <= 1.0):
            bad("document_recompute", "must be a number in [0, 1] (None: the server's --document-recompute)")
        if self.document_select is not None and self.document_select not in ("first", "deviation"):
            bad("document_select", "must be first or deviation (None: the server's --document-select)")
        if self.structural_tag is not None:
            bad("structural_tag", "not supported by this server (use regex, json_schema, choices or ebnf)")
        if self.stop_token_ids is not None:
            if not isinstance(self.stop_token_ids, (list, tuple)) or not all(
                is_int(t) and 0 <= t < vocab_size for t in self.stop_token_ids
            ):
                bad("stop_token_ids", f"must be a list of token ids in [0, {vocab_size})")
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                bad("logit_bias", "must be a mapping token_id -> bias")
            clean = {}
            for k, v in self.logit_bias.items():
                try:
                    tid = int(k)
                except (TypeError, ValueError):
                    bad("logit_bias", f"key {k!r} is not a token id")
                if not 0 <= tid < vocab_size:
                    bad("logit_bias", f"token id {tid} is outside [0, {vocab_size})")
                if not is_num(v):
                    bad("logit_bias", f"bias for {tid} must be a number")
                clean[tid] = float(v)
            self.logit_bias = clean
        if self.constraint_budget not in ("cut", "close"):
            bad("constraint_budget", 'must be "cut" or "close"')
        if self.thinking_token_budget is not None:
            if not is_int(self.thinking_token_budget) or self.thinking_token_budget < 0:
                bad("thinking_token_budget", "must be an integer >= 0")
            if self.require_reasoning is not True:
                bad("thinking_token_budget", "applies only to an output that thinks (set require_reasoning)")
        for name in ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim",
                     "require_reasoning"):
            if not isinstance(getattr(self, name), bool):
                bad(name, "must be a boolean")
