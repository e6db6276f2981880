"""/v1/responses items <-> chat messages: the conversation a request renders, and its tool shapes.

``input_items`` turns ``input`` into item dicts (a string is one user message).  ``chat_messages``
renders a conversation's items (the earlier turns' stored items, then this request's) as the chat
route's message dicts, so the chat template and the tool rendering are the chat route's
(``chat_encoder``, radixserve/tools/prompt.py): ``instructions`` first as a system message; a
``message`` item as a message of its role; ``function_call`` items as the ``tool_calls`` of an
assistant message (joined to the assistant message just before them, as one chat turn holds both);
``function_call_output`` as a ``tool`` message naming its call; a ``reasoning`` item as the
``reasoning_content`` of the assistant message after it (templates such as Qwen 3's render it).
Errors are RequestError(400) naming the field (``input.3.call_id: ...``).
``chat_tools`` / ``chat_tool_choice``: the Responses tool shapes in chat's nested form, for ``plan_tools``;
``format_schema``: ``text.format`` as the JSON-schema constraint.
"""
from __future__ import annotations

import uuid
from typing import Any, Optional, Union

from radixserve.server.openai.responses_protocol import FunctionTool, ResponsesRequest, ToolChoiceFunction
from radixserve.server.req_state import RequestError
from radixserve.tools.protocol import NamedToolChoice, ToolDef

UNSUPPORTED_PARTS = ("input_image", "input_file", "input_audio")


def new_id(prefix: str) -> str:
    """An object id as OpenAI's: ``resp_``, ``msg_``, ``fc_``, ``rs_`` + 32 hex digits."""
    return f"{prefix}_{uuid.uuid4().hex}"


def input_items(req: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's ``input`` as item dicts (the form they are stored in)."""
    if isinstance(req.input, str):
        return [{"type": "message", "role": "user", "content": req.input}]
    return [it.model_dump(by_alias=True, exclude_none=True) for it in req.input]


def content_text(content: Union[str, list[dict[str, Any]]], field: str) -> str:
    """The text of a message's content (a string, or text / refusal parts joined)."""
    if isinstance(content, str):
        return content
    out = []
    for j, part in enumerate(content):
        kind = part.get("type")
        if kind in UNSUPPORTED_PARTS:
            raise RequestError(400, f"{field}.{j}.type: {kind} parts are not supported (text-only models)")
        out.append(part.get("text") or part.get("refusal") or "")
    return "".join(out)


def _thought(item: dict[str, Any]) -> str:
    parts = item.get("content") or item.get("summary") or []
    return "".join(p.get("text", "") for p in parts)


def chat_messages(items: list[dict[str, Any]], instructions: Optional[str], first_new: int = 0) -> list[dict[str, Any]]:
    """Chat-template message dicts of the conversation ``items``; ``first_new``: the index of the first
    item of this request's ``input`` (errors name ``input.<k - first_new>``; earlier ones were checked)."""
    out: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    names: dict[str, str] = {}  # call_id -> function name
    thought: Optional[str] = None
    for k, item in enumerate(items):
        field = f"input.{k - first_new}"
        kind = item.get("type", "message")
        if kind == "reasoning":
            thought = _thought(item)
            continue
        if kind == "message":
            msg: dict[str, Any] = {"role": item["role"], "content": content_text(item["content"], f"{field}.content")}
        elif kind == "function_call":
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            names[item["call_id"]] = item["name"]
            if out and out[-1]["role"] == "assistant":
                out[-1].setdefault("tool_calls", []).append(call)
                continue
            msg = {"role": "assistant", "content": "", "tool_calls": [call]}
        else:  # function_call_output
            call_id = item.get("call_id")
            if not call_id:
                raise RequestError(400, f"{field}.call_id: required for a function_call_output item")
            msg = {"role": "tool", "content": content_text(item["output"], f"{field}.output"), "tool_call_id": call_id}
            name = item.get("name") or names.get(call_id)
            if name:
                msg["name"] = name
        if thought is not None and msg["role"] == "assistant":
            msg["reasoning_content"] = thought
            thought = None
        out.append(msg)
    if not out or all(m["role"] in ("system", "developer") for m in out):
        raise RequestError(400, "input: the conversation has no message to answer (give input)")
    return out


def chat_tools(tools: Optional[list[FunctionTool]]) -> Optional[list[ToolDef]]:
    """Function tools in chat's form (``{"type": "function", "function": {...}}``)."""
    if tools is None:
        return None
    return [ToolDef.model_validate({"type": "function", "function": t.model_dump(
        include={"name", "description", "parameters", "strict"}, exclude_none=True)}) for t in tools]


def chat_tool_choice(choice: Union[str, ToolChoiceFunction, None]) -> Union[str, NamedToolChoice, None]:
    if isinstance(choice, ToolChoiceFunction):
        return NamedToolChoice.model_validate({"type": "function", "function": {"name": choice.name}})
    return choice


def format_schema(req: ResponsesRequest) -> Optional[Any]:
    """The ``json_schema`` constraint of ``text.format`` (chat's ``response_format``), None for text."""
    fmt = req.text.format if req.text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "object"}
    if fmt.schema_ is None:
        raise RequestError(400, "text.format.schema: required for type json_schema")
    return fmt.schema_
