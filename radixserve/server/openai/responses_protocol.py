"""The request body of POST /v1/responses (OpenAI's Responses API) as pydantic models.

Every object is closed: an unknown key is a 400 naming it (the names: ``server/openai_fields.py``,
``RESPONSES_*``).  ``input`` is a string or a list of items told apart by ``type`` (a message item
may leave it out, as the ``openai`` client's ``EasyInputMessageParam`` does): ``message``,
``function_call``, ``function_call_output`` and ``reasoning`` are what a text model's conversation
holds; the built-in tools' items (web search, computer use, ...) are refused by the discriminator,
naming the ``type``.  ``tools`` take ``{"type": "function", "name", "parameters", ...}`` (the flat
Responses form, not chat's nested ``function``).
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, StrictBool, StrictInt, Tag, create_model

from radixserve.server.openai_fields import (RESPONSES_CONTENT_PART_IGNORED, RESPONSES_IGNORED,
                                             RESPONSES_TOOL_IGNORED, ignored_fields)

Status = Optional[Literal["in_progress", "completed", "incomplete"]]


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, populate_by_name=True)


class InputPart(create_model("_InputPartIgnored", __base__=_Closed, **ignored_fields(RESPONSES_CONTENT_PART_IGNORED))):
    """A message's content part: ``input_text`` / ``output_text`` carry ``text``; ``refusal`` its
    ``refusal``; image, file and audio parts are refused (text-only models)."""

    type: Literal["input_text", "output_text", "refusal", "input_image", "input_file", "input_audio",
                  "summary_text", "reasoning_text"]
    text: Optional[str] = None
    refusal: Optional[str] = None


class MessageItem(_Closed):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: Union[str, list[InputPart]]
    id: Optional[str] = None
    status: Status = None
    phase: Optional[Literal["commentary", "final_answer"]] = None  # an assistant message's phase: not rendered


class FunctionCallItem(_Closed):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: Optional[str] = None
    status: Status = None
    namespace: Optional[str] = None
    caller: Optional[dict[str, Any]] = None
    async_: Optional[bool] = Field(default=None, alias="async")  # an earlier call's flag: not rendered


class FunctionCallOutputItem(_Closed):
    type: Literal["function_call_output"]
    call_id: Optional[str] = None
    output: Union[str, list[InputPart]]
    id: Optional[str] = None
    status: Status = None
    name: Optional[str] = None
    namespace: Optional[str] = None
    caller: Optional[dict[str, Any]] = None


class ReasoningText(_Closed):
    type: Literal["summary_text", "reasoning_text"]
    text: str


class ReasoningItem(_Closed):
    type: Literal["reasoning"]
    id: Optional[str] = None
    summary: list[ReasoningText] = Field(default_factory=list)
    content: Optional[list[ReasoningText]] = None
    encrypted_content: Optional[str] = None
    status: Status = None


_TAGS = {"message": "Message", "function_call": "FunctionCall", "function_call_output": "FunctionCallOutput",
         "reasoning": "Reasoning"}  # capitalized: validation_message leaves union tags out of the field path


def _item_tag(value: Any) -> Optional[str]:
    kind = value.get("type", "message") if isinstance(value, dict) else getattr(value, "type", None)
    return _TAGS.get(kind)


InputItem = Annotated[Union[Annotated[MessageItem, Tag("Message")], Annotated[FunctionCallItem, Tag("FunctionCall")],
                            Annotated[FunctionCallOutputItem, Tag("FunctionCallOutput")],
                            Annotated[ReasoningItem, Tag("Reasoning")]],
                      Discriminator(_item_tag, custom_error_type="item_type",
                                    custom_error_message="unsupported item type (message, function_call, "
                                                         "function_call_output or reasoning; the built-in tools' "
                                                         "items are not supported)")]


class FunctionTool(create_model("_FunctionToolIgnored", __base__=_Closed, **ignored_fields(RESPONSES_TOOL_IGNORED))):
    type: Literal["function"]
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None
    strict: Optional[bool] = None


class ToolChoiceFunction(_Closed):
    type: Literal["function"]
    name: str


class TextFormat(_Closed):
    """``text.format``: ``text``, ``json_object``, or ``json_schema`` with ``name`` and ``schema``."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    type: Literal["text", "json_object", "json_schema"]
    name: Optional[str] = None
    schema_: Optional[dict[str, Any]] = Field(default=None, alias="schema")
    description: Optional[str] = None
    strict: Optional[bool] = None


class TextConfig(_Closed):
    format: Optional[TextFormat] = None
    verbosity: Optional[Literal["low", "medium", "high"]] = None  # no effect here


class ReasoningConfig(_Closed):
    """``reasoning``: ``effort: "none"`` turns thinking off where the template has a switch; the rest is
    accepted and has no effect (the thinking is returned whole, not summarized)."""

    effort: Optional[Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]] = None
    summary: Optional[Literal["auto", "concise", "detailed"]] = None
    generate_summary: Optional[Literal["auto", "concise", "detailed"]] = None
    context: Optional[Literal["auto", "current_turn", "all_turns"]] = None
    mode: Optional[str] = None


class ResponsesRequest(create_model("_ResponsesIgnored", __base__=_Closed, **ignored_fields(RESPONSES_IGNORED))):
    """POST /v1/responses."""

    model: Optional[str] = None
    input: Union[list[InputItem], str] = Field(default_factory=list)  # list first: its errors are named first
    instructions: Optional[str] = None
    max_output_tokens: Optional[StrictInt] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    tools: Optional[list[FunctionTool]] = None
    tool_choice: Union[Literal["none", "auto", "required"], ToolChoiceFunction, None] = None
    parallel_tool_calls: Optional[bool] = None
    text: Optional[TextConfig] = None
    reasoning: Optional[ReasoningConfig] = None
    previous_response_id: Optional[str] = None
    store: Optional[StrictBool] = None
    stream: Optional[StrictBool] = None
    metadata: Optional[dict[str, str]] = None
    user: Optional[str] = None
    truncation: Optional[Literal["auto", "disabled"]] = None
    background: Optional[StrictBool] = None
    conversation: Optional[Union[str, dict[str, Any]]] = None
    prompt: Optional[dict[str, Any]] = None
    # extensions (vLLM's and SGLang's sampling fields; docs in openai_fields.py)
    top_k: Optional[StrictInt] = None
    min_p: Optional[float] = None
    repetition_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    presence_penalty: Optional[float] = None
    seed: Optional[StrictInt] = None
    stop: Union[str, list[str], None] = None
    priority: Optional[StrictInt] = None
    cache_salt: Optional[str] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None
    thinking_token_budget: Optional[StrictInt] = None


# the request's fields that are ``SamplingParams`` fields under the same name
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "frequency_penalty",
                   "presence_penalty", "seed", "stop", "priority", "cache_salt", "thinking_token_budget")
