"""``tools`` / ``tool_choice`` / ``parallel_tool_calls`` of a chat request -> a ``ToolPlan``.

- ``none`` (the default without tools): no tools in the prompt, no constraint, no parsing;
- ``auto`` (the default with tools): tools in the prompt, free generation, calls parsed from
  the text in the chat template's format (radixserve/tools/parsers.py);
- ``required``: the output is constrained (``json_schema``) to a call of one of the tools:
  ``{"name": <const>, "arguments": <the function's parameters schema>}``, or with
  ``parallel_tool_calls`` (OpenAI's default: true) a non-empty array of such calls;
- a named function (``{"type": "function", "function": {"name": ...}}``): exactly one call
  of that function, constrained the same way.

The user's parameter schemas are embedded unchanged (a function without ``parameters``
takes none: ``{}``); their ``$defs``/``definitions`` are hoisted to the root under
``tool<i>_<name>`` and their ``#/$defs/...`` references rewritten (other ``$ref`` targets are
refused).  Errors are ``ValueError`` whose message starts with the field (``tools.1.function.
parameters: ...``); the server turns them into 400s.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from pydantic import TypeAdapter, ValidationError

from radixserve.validation import validation_message
from radixserve.tools.protocol import NamedToolChoice, ToolDef

NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}
_TOOLS = TypeAdapter(list[ToolDef])


@dataclass
class ToolPlan:
    mode: str = "none"  # none | auto | required | named
    tools: list[dict[str, Any]] = field(default_factory=list)  # OpenAI tool dicts, for the prompt
    names: set[str] = field(default_factory=set)
    schema: Optional[dict[str, Any]] = None  # the json_schema constraint (required / named)


def check_tools(raw: Any) -> list[ToolDef]:
    """Validate a list of OpenAI tool dicts (for callers that do not go through pydantic)."""
    try:
        return _TOOLS.validate_python(raw)
    except ValidationError as e:
        raise ValueError("tools." + validation_message(list(e.errors()))) from None


def _rename_refs(node: Any, i: int) -> Any:
    if isinstance(node, list):
        return [_rename_refs(v, i) for v in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for k, v in node.items():
        if k == "$ref" and isinstance(v, str):
            for prefix in ("#/$defs/", "#/definitions/"):
                if v.startswith(prefix):
                    v = f"#/$defs/tool{i}_" + v[len(prefix):]
                    break
            else:
                raise ValueError(f"tools.{i}.function.parameters: $ref {v!r} is not supported "
                                 "(only references into the schema's own $defs / definitions)")
        out[k] = _rename_refs(v, i)
    return out


def _arguments(tool: ToolDef, i: int, defs: dict[str, Any]) -> dict[str, Any]:
    params = tool.function.parameters
    if params is None or params == {}:
        return dict(NO_PARAMETERS)
    params = copy.deepcopy(params)
    for key in ("$defs", "definitions"):
        local = params.pop(key, None)
        if local is None:
            continue
        if not isinstance(local, dict):
            raise ValueError(f"tools.{i}.function.parameters.{key}: must be an object")
        defs.update({f"tool{i}_{name}": _rename_refs(sub, i) for name, sub in local.items()})
    return _rename_refs(params, i)


def call_schema(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": {"name": {"const": name}, "arguments": arguments},
            "required": ["name", "arguments"], "additionalProperties": False}


def calls_schema(tools: list[ToolDef], indices: list[int], parallel: bool) -> dict[str, Any]:
    """The constraint for a call of one of ``tools[indices]`` (an array when ``parallel``)."""
    defs: dict[str, Any] = {}
    alts = [call_schema(tools[i].function.name, _arguments(tools[i], i, defs)) for i in indices]
    one = alts[0] if len(alts) == 1 else {"anyOf": alts}
    schema = {"type": "array", "items": one, "minItems": 1} if parallel else dict(one)
    if defs:
        schema["$defs"] = defs
    return schema


def plan_tools(tools: Optional[list[ToolDef]], tool_choice: Union[str, NamedToolChoice, None],
               parallel_tool_calls: Optional[bool]) -> ToolPlan:
    """The plan of a request (``tools`` already validated by pydantic or ``check_tools``)."""
    tools = tools or []
    if tool_choice is None:
        tool_choice = "auto" if tools else "none"
    if not tools:
        if tool_choice != "none":
            raise ValueError("tool_choice: needs tools (give tools, or tool_choice 'none')")
        return ToolPlan()
    names = [t.function.name for t in tools]
    for i, n in enumerate(names):
        if n in names[:i]:
            raise ValueError(f"tools.{i}.function.name: duplicate function name {n!r}")
    dicts = [t.model_dump(exclude_none=True) for t in tools]
    plan = ToolPlan("none", dicts, set(names))
    if tool_choice == "none":
        plan.tools = []
        return plan
    if tool_choice == "auto":
        plan.mode = "auto"
        return plan
    if tool_choice == "required":
        plan.mode = "required"
        plan.schema = calls_schema(tools, list(range(len(tools))), parallel_tool_calls is not False)
        return plan
    if not isinstance(tool_choice, NamedToolChoice):
        raise ValueError(f"tool_choice: unknown value {tool_choice!r} (none, auto, required or a named function)")
    name = tool_choice.function.name
    if name not in names:
        raise ValueError(f"tool_choice.function.name: {name!r} is not one of the tools ({', '.join(names)})")
    plan.mode = "named"
    plan.schema = calls_schema(tools, [names.index(name)], False)
    return plan


def tool_schema_for_check(tools: list[ToolDef], i: int) -> dict[str, Any]:
    """The constraint of tool ``i`` alone (to name the tool whose schema does not compile)."""
    return calls_schema(tools, [i], False)
