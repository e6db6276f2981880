"""frontend_lang tool calling on both backends (the tiny model: the ``required`` / named
constraint makes any model produce a valid call): ``gen(tools=...)`` + ``state.tool_calls``."""
from __future__ import annotations

import json

import jsonschema
import pytest

from frontend_lang import assistant, function, gen, system, tools_prompt, user
from frontend_lang.tools import make_plan, parse_calls

PARAMS = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]},
                                           "days": {"type": "integer", "minimum": 1, "maximum": 5}},
          "required": ["city", "days"]}
TOOLS = [{"type": "function", "function": {"name": "forecast", "parameters": PARAMS}},
         {"type": "function", "function": {"name": "noop"}}]


@function
def ask(s, choice):
    s += system(tools_prompt(TOOLS))
    s += user("Weather in Paris for 2 days?")
    s += assistant(gen("answer", tools=TOOLS, tool_choice=choice, parallel_tool_calls=False, max_tokens=40))


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "forecast"}}])
def test_constrained_calls_on_both_backends(backend, choice):
    state = ask.run(backend=backend, choice=choice, temperature=0)
    assert state.error() is None
    [call] = state.tool_calls("answer")
    assert call["id"].startswith("call_") and call["function"]["arguments"] in state["answer"]
    if isinstance(choice, dict):
        assert call["function"]["name"] == "forecast"
    if call["function"]["name"] == "forecast":
        jsonschema.validate(json.loads(call["function"]["arguments"]), PARAMS)


def test_auto_parses_hermes_text_and_errors_name_the_argument():
    plan = make_plan(TOOLS, None, None)
    text = 'Sure. <tool_call>\n{"name": "forecast", "arguments": {"city": "Rome", "days": 1}}\n</tool_call>'
    [call] = parse_calls(plan, text, "{{ messages }}")  # a template without tools: Hermes
    assert call["function"] == {"name": "forecast", "arguments": '{"city": "Rome", "days": 1}'}
    assert "<tools>" in tools_prompt(TOOLS) and "<tool_call>" in tools_prompt(TOOLS)
    with pytest.raises(ValueError, match=r"^gen: tool_choice: unknown value"):
        gen("x", tools=TOOLS, tool_choice="sometimes")
    with pytest.raises(ValueError, match=r"^gen: tool_choice\.function\.name"):
        gen("x", tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}})
    with pytest.raises(ValueError, match=r"^gen: tools\.0\.function"):
        gen("x", tools=[{"type": "function", "function": {}}])
    assert make_plan(TOOLS, "none", None) is None
