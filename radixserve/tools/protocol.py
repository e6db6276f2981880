"""The OpenAI tool-calling shapes of a chat request: ``tools[i]``, a named ``tool_choice``,
and an assistant message's ``tool_calls`` (pydantic; see docs/tool_calling.md)."""
from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, Field


class FunctionDef(BaseModel):
    """``tools[i].function``: ``parameters`` is a JSON schema (absent: no parameters)."""

    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None
    strict: Optional[bool] = None


class ToolDef(BaseModel):
    type: Literal["function"]
    function: FunctionDef


class ToolChoiceFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: ToolChoiceFunction


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall
