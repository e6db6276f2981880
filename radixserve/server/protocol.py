"""Request bodies of the native (SGLang) and OpenAI-compatible APIs as pydantic models.

Types are checked here (pydantic names the field of a wrong type); value ranges are
checked by ``SamplingParams.verify`` and the TokenizerManager, which also name the field.
"""
from __future__ import annotations

import dataclasses
import typing
from typing import Any, Callable, Literal, Optional, Union

from pydantic import (BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationInfo, create_model,
                      field_validator)
from pydantic_core import PydanticCustomError

from radixserve.sampling_params import SamplingParams
from radixserve.server.openai_fields import (CHAT_IGNORED, CONTENT_PART_IGNORED, MESSAGE_IGNORED,
                                             STREAM_OPTIONS_IGNORED, ignored_fields)
from radixserve.tools.protocol import NamedToolChoice, ToolCall, ToolDef


class _SamplingBase(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


# fields whose JSON must already have the type (no "5" or true for an int)
STRICT_TYPES: dict[str, Any] = {"priority": StrictInt}


def sampling_fields(exclude: tuple[str, ...] = ()) -> dict[str, Any]:
    """Every field of ``SamplingParams`` but ``exclude``, optional (default None) and typed
    from its annotations (``STRICT_TYPES`` overrides), as ``create_model`` takes them: the
    request models follow the dataclass when fields are added."""
    hints = {**typing.get_type_hints(SamplingParams), **STRICT_TYPES}
    return {f.name: (Optional[hints[f.name]], None) for f in dataclasses.fields(SamplingParams)
            if f.name not in exclude}


# the native API's ``sampling_params``: unknown names are rejected
SamplingParamsIn = create_model("SamplingParamsIn", __base__=_SamplingBase, **sampling_fields())


def _unset(value: Any) -> bool:
    """A default of SGLang's: None, False, 0, "" or an empty/all-unset list or dict."""
    if isinstance(value, (list, tuple)):
        return all(_unset(v) for v in value)
    if isinstance(value, dict):
        return not value
    return value is None or value is False or value == 0 or value == ""


# Fields of SGLang's GenerateReqInput that would change the result or the response's shape
# and that this server cannot honour: a 400 naming the field when set to anything but
# their default (None / False / 0 / an empty list).
UNSUPPORTED_WHEN_SET: dict[str, str] = {
    "input_embeds": "input embeddings are not supported (give text or input_ids)",
    "image_data": "this server serves text-only models",
    "video_data": "this server serves text-only models",
    "audio_data": "this server serves text-only models",
    "token_ids_logprob": "logprobs of chosen token ids are not supported (use top_logprobs_num)",
    "return_hidden_states": "hidden states are not returned by this server",
    "return_routed_experts": "this server serves dense models (no experts)",
    "session_params": "sessions are not supported",
    "lora_id": "LoRA adapters are named by lora_path here (SGLang's internal lora_id is not taken)",
    "custom_logit_processor": "custom logit processors are not supported",
    "background": "background requests are not supported",
    "return_bytes": "output bytes are not returned by this server",
    "return_entropy": "entropy is not returned by this server",
}

# Fields of SGLang's GenerateReqInput accepted and ignored: scheduling, routing,
# disaggregation, logging and multimodal hints with no effect on a single text-only rank.
IGNORED: tuple[str, ...] = (
    "log_metrics", "routed_experts_start_len", "modalities", "bootstrap_host", "bootstrap_port",
    "bootstrap_room", "bootstrap_pair_key", "decode_tp_size", "routed_dp_rank", "disagg_prefill_dp_rank",
    "data_parallel_rank", "conversation_id", "extra_key", "routing_key", "no_logs", "custom_labels",
    "external_trace_header", "received_time", "need_wait_for_mm_inputs", "num_items_assigned",
    "max_dynamic_patch", "min_dynamic_patch", "image_max_dynamic_patch", "video_max_dynamic_patch",
    "http_worker_ipc",
)


class SegmentIn(BaseModel):
    """One segment of ``segments`` (radixserve/tokenizer.py): exactly one of ``text`` and
    ``input_ids``; ``document`` marks it as a document, reusable out of order.  The OpenAPI
    document's shape: the segments are checked by ``radixserve.tokenizer`` (one check for the
    server and the Engine, errors naming ``segments.i.key``)."""

    model_config = ConfigDict(extra="forbid")
    text: Optional[StrictStr] = None
    input_ids: Optional[list[StrictInt]] = None
    document: StrictBool = False


SegmentsIn = Union[list[SegmentIn], list[list[SegmentIn]], None]


class _GenerateBase(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")
    text: Union[str, list[str], None] = None
    input_ids: Union[list[int], list[list[int]], None] = None
    # radixserve's (issue 46): the prompt as segments, some marked as documents; or a list of such lists
    segments: SegmentsIn = None
    sampling_params: Union[SamplingParamsIn, list[SamplingParamsIn], None] = None
    rid: Union[str, list[str], None] = None
    stream: bool = False
    return_logprob: Union[bool, list[bool], None] = False
    logprob_start_len: Union[int, list[int], None] = -1
    top_logprobs_num: Union[int, list[int], None] = 0
    return_text_in_logprobs: bool = False
    priority: Optional[StrictInt] = None  # SGLang's place for it: applies to every prompt
    cache_salt: Optional[str] = None  # vLLM's: the prompts' prefix-cache namespace (SamplingParams.cache_salt)
    # SGLang's: a loaded LoRA adapter's name for every prompt, or a list with one name or None per prompt
    lora_path: Union[str, list[Optional[str]], None] = None
    # SGLang's: the output starts inside the model's thinking (--reasoning-parser); a constraint applies after it
    require_reasoning: StrictBool = False

    @field_validator(*UNSUPPORTED_WHEN_SET, check_fields=False)
    @classmethod
    def _refuse(cls, value: Any, info: ValidationInfo) -> Any:
        if not _unset(value):
            raise PydanticCustomError("unsupported", UNSUPPORTED_WHEN_SET[info.field_name])
        return value

    @field_validator("segments", mode="plain", json_schema_input_type=SegmentsIn)
    @classmethod
    def _raw_segments(cls, value: Any) -> Any:
        """Passed on as sent: ``split_prompts`` checks them (radixserve/tokenizer.py)."""
        return value

    @field_validator("return_logprob", "logprob_start_len", "top_logprobs_num")
    @classmethod
    def _scalar(cls, value: Any, info: ValidationInfo) -> Any:
        """SGLang allows a per-prompt list; equal values are accepted as one."""
        if isinstance(value, list):
            if any(v != value[0] for v in value):
                raise PydanticCustomError("per_prompt", "per-prompt values must be equal here; give one value")
            value = value[0] if value else None
        return _DEFAULTS[info.field_name] if value is None else value

    @field_validator("lora_path")
    @classmethod
    def _adapter_names(cls, value: Any) -> Any:
        names = value if isinstance(value, list) else [value]
        if any(n is not None and not n for n in names):
            raise PydanticCustomError("lora_path", "an adapter name must be a non-empty string (None: the base model)")
        return value


_DEFAULTS = {"return_logprob": False, "logprob_start_len": -1, "top_logprobs_num": 0}

GenerateReqInput = create_model(
    "GenerateReqInput", __base__=_GenerateBase, __doc__="""POST /generate: every field of SGLang's
    GenerateReqInput (sglang 0.5.10); unknown names get a 400 naming them.  The fields with no
    meaning here are typed ``Any`` and listed in ``UNSUPPORTED_WHEN_SET`` and ``IGNORED``.""",
    **{name: (Any, None) for name in (*UNSUPPORTED_WHEN_SET, *IGNORED)})


class ConcatAndAppendReqInput(BaseModel):
    """POST /concate_and_append_request (SGLang's frontend, ``fork().join("concate_and_append")``)."""

    src_rids: list[str] = Field(default_factory=list)
    dst_rid: str = ""


class LoadLoRAAdapterReqInput(BaseModel):
    """POST /load_lora_adapter (SGLang's body): serve the PEFT adapter directory ``lora_path``
    as ``lora_name``."""

    model_config = ConfigDict(extra="forbid")
    lora_name: str
    lora_path: str
    pinned: bool = False  # SGLang's: keep the adapter in a slot; accepted, the slots here are least recently used


class UnloadLoRAAdapterReqInput(BaseModel):
    """POST /unload_lora_adapter (SGLang's body)."""

    model_config = ConfigDict(extra="forbid")
    lora_name: str


class AbortReqInput(BaseModel):
    rid: str = ""
    abort_all: bool = False


class _Closed(BaseModel):
    """An OpenAI object whose unknown keys are a 400 naming them (radixserve/server/openai_fields.py)."""

    model_config = ConfigDict(extra="forbid")


class StreamOptions(create_model("_StreamOptionsIgnored", __base__=_Closed, **ignored_fields(STREAM_OPTIONS_IGNORED))):
    include_usage: bool = False


class JsonSchemaFormat(BaseModel):
    """``response_format.json_schema`` of the OpenAI API."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid")
    name: Optional[str] = None
    description: Optional[str] = None
    schema_: Optional[dict[str, Any]] = Field(default=None, alias="schema")
    strict: Optional[bool] = None


class ResponseFormat(_Closed):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JsonSchemaFormat] = None


# SamplingParams fields the OpenAI routes take under OpenAI's name or through another field
OPENAI_EXCLUDED = ("max_new_tokens", "min_new_tokens", "json_schema", "choices", "n")
OPENAI_SAMPLING_FIELDS = tuple(sampling_fields(OPENAI_EXCLUDED))


class _OpenAIFields(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")  # the names: server/openai_fields.py
    model: Optional[str] = None
    max_tokens: Optional[int] = None
    min_tokens: Optional[int] = None  # SGLang's extension
    n: int = 1
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    user: Optional[str] = None
    rid: Optional[str] = None
    # structured output: OpenAI's response_format (SGLang's regex is a sampling field)
    response_format: Optional[ResponseFormat] = None
    json_schema: Union[str, dict[str, Any], None] = None  # SGLang's: the schema response_format would give


# Fields shared by /v1/completions and /v1/chat/completions: OpenAI's, plus every other
# SamplingParams field under its own name (SGLang's extensions: top_k, regex, stop_regex, ...)
_OpenAIBase = create_model("_OpenAIBase", __base__=_OpenAIFields, **sampling_fields(OPENAI_EXCLUDED))


class CompletionRequest(_OpenAIBase):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    logprobs: Optional[int] = Field(default=None, ge=0, le=20)
    echo: bool = False
    suffix: Optional[str] = None
    best_of: Optional[int] = None


class ContentPart(create_model("_ContentPartIgnored", __base__=_Closed, **ignored_fields(CONTENT_PART_IGNORED))):
    type: str
    text: Optional[str] = None
    document: StrictBool = False  # radixserve's: a text part that is a document, reusable out of order


class ChatMessage(create_model("_ChatMessageIgnored", __base__=_Closed, **ignored_fields(MESSAGE_IGNORED))):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: Union[str, list[ContentPart], None] = None
    name: Optional[str] = None
    tool_calls: Optional[list[ToolCall]] = None  # assistant messages
    tool_call_id: Optional[str] = None  # tool messages

    def text(self, mark: Optional[Callable[[str], str]] = None) -> str:
        """The text parts joined; with ``mark``, a document part is ``mark(its text)`` instead."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(mark(p.text or "") if mark is not None and p.document else p.text or ""
                       for p in self.content if p.type == "text")

    def has_documents(self) -> bool:
        return isinstance(self.content, list) and any(p.document for p in self.content)


class ChatCompletionRequest(create_model("_ChatIgnored", __base__=_OpenAIBase, **ignored_fields(CHAT_IGNORED))):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[int] = None
    logprobs: bool = False
    top_logprobs: Optional[int] = Field(default=None, ge=0, le=20)
    tools: Optional[list[ToolDef]] = None
    tool_choice: Union[Literal["none", "auto", "required"], NamedToolChoice, None] = None
    parallel_tool_calls: Optional[bool] = None
    # SGLang's and vLLM's: continue the last (assistant) message instead of opening a new one
    continue_final_message: bool = False
    chat_template_kwargs: Optional[dict[str, Any]] = None  # SGLang's and vLLM's: extra chat-template variables
    separate_reasoning: bool = True  # SGLang's: reasoning_content apart from content (reasoning models)
