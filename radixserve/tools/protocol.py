"""The OpenAI tool-calling shapes of a chat request: ``tools[i]``, a named ``tool_choice``,
and an assistant message's ``tool_calls`` (pydantic; see docs/tool_calling.md).  Each takes the
fields of OpenAI's API reference and no other: an unknown key is an error naming it."""
from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FunctionDef(_Closed):
    """``tools[i].function``: ``parameters`` is a JSON schema (absent: no parameters)."""

    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None
    strict: Optional[bool] = None


class ToolDef(_Closed):
    type: Literal["function"]
    function: FunctionDef


class ToolChoiceFunction(_Closed):
    name: str


class NamedToolChoice(_Closed):
    type: Literal["function"]
    function: ToolChoiceFunction


class FunctionCall(_Closed):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(_Closed):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall
    # a streamed call's position, sent back by clients that rebuilt the message from deltas: ignored
    index: Optional[int] = Field(default=None, exclude=True)
