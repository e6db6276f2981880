"""Tools and tool messages in the prompt: the default (Hermes) rendering and the HF form.

A chat template that handles tools itself (it refers to ``tools`` / ``tool_calls``) gets the
messages in Hugging Face's form (``hf_messages``: a call's ``arguments`` as an object) and
``tools=`` passed to ``apply_chat_template``.  Any other template (SmolLM2's, plain ChatML)
gets the Hermes rendering (``hermes_messages``), as Hermes 2 Pro and Qwen 2.5 define it:

- the tool definitions go at the end of the system message (one is added when the
  conversation has none), one JSON object per line inside ``<tools></tools>``, followed by
  the instruction to answer with ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``;
- an assistant message's ``tool_calls`` are appended to its content, one
  ``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`` block each;
- ``role: tool`` messages become a user message of ``<tool_response>\\n...\\n</tool_response>``
  blocks (consecutive tool results share one message).
"""
from __future__ import annotations

import json
from typing import Any

TOOLS_HEADER = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
TOOLS_FOOTER = ("\n</tools>\n\nFor each function call, return a json object with function name and arguments "
                "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
                '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


def tools_system_prompt(tools: list[dict[str, Any]]) -> str:
    """The Hermes tools section of the system prompt."""
    return TOOLS_HEADER + "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools) + TOOLS_FOOTER


def _arguments(raw: Any) -> Any:
    """A call's arguments as an object when they are JSON text, else as given."""
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


def hf_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages in the form HF chat templates with tool support expect."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [{**c, "function": {**c["function"], "arguments": _arguments(c["function"]["arguments"])}}
                               for c in m["tool_calls"]]
        out.append(m)
    return out


def call_block(call: dict[str, Any]) -> str:
    fn = call["function"]
    body = json.dumps({"name": fn["name"], "arguments": _arguments(fn["arguments"])}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


def hermes_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Plain {"role", "content"} messages carrying tools, calls and results as Hermes text."""
    out: list[dict[str, Any]] = []
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "assistant" and m.get("tool_calls"):
            blocks = "\n".join(call_block(c) for c in m["tool_calls"])
            out.append({"role": role, "content": f"{content}\n{blocks}" if content else blocks})
        elif role == "tool":
            block = f"<tool_response>\n{content}\n</tool_response>"
            if out and out[-1].get("_tool"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool": True})
        else:
            out.append({"role": role, "content": content})
    if tools:
        section = tools_system_prompt(tools)
        if out and out[0]["role"] in ("system", "developer"):
            out[0]["content"] = f"{out[0]['content']}\n\n{section}" if out[0]["content"] else section
        else:
            out.insert(0, {"role": "system", "content": section})
    for m in out:
        m.pop("_tool", None)
    return out
