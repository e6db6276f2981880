"""Tool calling in programs: ``gen(name, tools=[...], tool_choice=...)`` and ``tools_prompt``.

    s += system("You are a weather bot.\\n\\n" + tools_prompt(TOOLS))
    s += user("Weather in Paris?")
    s += assistant(gen("answer", tools=TOOLS, tool_choice="required", max_tokens=64))
    state["answer"]              # the generated text
    state.tool_calls("answer")   # [{"id", "type": "function", "function": {"name", "arguments"}}]

The semantics are the server's (/v1/chat/completions, radixserve/tools/spec.py):
``required`` / a named function (``{"type": "function", "function": {"name": ...}}``)
constrain the output to a call (a ``json_schema`` constraint built from the functions'
parameters), ``auto`` (the default) parses calls from free text in the chat template's
tool format (Hermes ``<tool_call>`` when the template has none), ``none`` is a plain gen.
The program puts the tools in the prompt itself: ``tools_prompt`` is the Hermes section
the server adds to the system message for templates without tool support.
"""
from __future__ import annotations

from typing import Any, Optional

from radixserve.tools.parsers import HermesParser, detect_format, make_parser
from radixserve.tools.prompt import tools_system_prompt
from radixserve.tools.protocol import NamedToolChoice
from radixserve.tools.spec import ToolPlan, check_tools, plan_tools
from radixserve.tools.stream import ToolCallStream


def tools_prompt(tools: list[dict[str, Any]]) -> str:
    """The Hermes tools section (``<tools>...</tools>`` and the ``<tool_call>`` instruction)."""
    return tools_system_prompt([t.model_dump(exclude_none=True) for t in check_tools(tools)])


def make_plan(tools: Optional[list[dict[str, Any]]], tool_choice: Any,
              parallel_tool_calls: Optional[bool]) -> Optional[ToolPlan]:
    """The plan of a gen's tool arguments (None: no tools); ValueError names the argument."""
    if tools is None and tool_choice is None:
        return None
    try:
        if isinstance(tool_choice, dict):
            tool_choice = NamedToolChoice.model_validate(tool_choice)
        elif tool_choice not in (None, "none", "auto", "required"):
            raise ValueError(f"tool_choice: unknown value {tool_choice!r} (none, auto, required or "
                             "{'type': 'function', 'function': {'name': ...}})")
        plan = plan_tools(check_tools(tools or []), tool_choice, parallel_tool_calls)
    except ValueError as e:
        raise ValueError(f"gen: {e}") from None
    return None if plan.mode == "none" else plan


def sampling_with_tools(plan: ToolPlan, params: dict[str, Any], template_source: str,
                        parallel_tool_calls: Optional[bool]) -> dict[str, Any]:
    """``params`` plus the plan's constraint (required / named) or, in auto mode with a
    single Hermes call, the closing tag as a stop string."""
    params = dict(params)
    if plan.schema is not None:
        clash = [k for k in ("json_schema", "regex", "choices") if params.get(k) is not None]
        if clash:
            raise ValueError(f"gen: {clash[0]} cannot be combined with tool_choice {plan.mode!r}")
        params["json_schema"] = plan.schema
    elif parallel_tool_calls is False and _format(plan, template_source) == "hermes":
        stop = params.get("stop") or []
        params["stop"] = [*([stop] if isinstance(stop, str) else stop), HermesParser.close]
    return params


def _format(plan: ToolPlan, template_source: str) -> str:
    return "json" if plan.schema is not None else detect_format(template_source) or "hermes"


def parse_calls(plan: ToolPlan, text: str, template_source: str) -> list[dict[str, Any]]:
    """The calls in a finished gen's ``text``, as OpenAI's ``message.tool_calls``."""
    return ToolCallStream(make_parser(_format(plan, template_source), plan.names)).message(text)[1]
