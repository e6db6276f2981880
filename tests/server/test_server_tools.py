"""Tool calling through the official ``openai`` package against the real SmolLM2 server:
``required`` (every call validates against the function's schema, temperature 0 and 1),
a named function, ``auto`` (streamed and not), a ``role: tool`` round trip, and the 400s."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState

pytestmark = pytest.mark.slow

FORECAST = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12},
    "days": {"type": "integer", "minimum": 1, "maximum": 7},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city", "days"]}
TIME = {"type": "object", "properties": {"tz": {"type": "string", "enum": ["UTC", "CET", "JST"]}}, "required": ["tz"]}
TOOLS = [{"type": "function", "function": {"name": "get_forecast", "description": "Weather forecast for a city",
                                           "parameters": FORECAST}},
         {"type": "function", "function": {"name": "get_time", "description": "Current time", "parameters": TIME}}]
SCHEMAS = {"get_forecast": FORECAST, "get_time": TIME}
ASK = [{"role": "user", "content": "What will the weather be in Paris for the next 3 days?"}]


@pytest.fixture(scope="module")
def oai(smol_server):
    return openai.OpenAI(base_url=smol_server.url + "/v1", api_key="none", max_retries=0, timeout=120)


def assert_valid_calls(choice) -> list:
    calls = choice.message.tool_calls
    assert choice.finish_reason == "tool_calls" and calls, choice
    for c in calls:
        assert c.id.startswith("call_") and c.type == "function"
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])
    return calls


@pytest.fixture(scope="module")
def required_t0(oai):
    """A greedy ``required`` answer with parallel calls allowed (OpenAI's default): an array."""
    return oai.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice="required",
                                       temperature=0, max_tokens=60)


def test_required_calls_validate_at_temperature_0_and_1(oai, required_t0):
    assert required_t0.choices[0].message.content is None
    assert_valid_calls(required_t0.choices[0])
    # 8 samples at temperature 1 (copy i of a request with seed s samples with seed s + i), one
    # call each or (parallel calls allowed) an array of calls; both requests run together
    kw = dict(model="m", messages=ASK, tools=TOOLS, tool_choice="required", n=4, temperature=1.0, max_tokens=60)
    single, multi = together(lambda: oai.chat.completions.create(**kw, parallel_tool_calls=False, seed=1),
                             lambda: oai.chat.completions.create(**kw, seed=11))
    for ch in single.choices:
        assert len(assert_valid_calls(ch)) == 1
    for ch in multi.choices:
        assert_valid_calls(ch)


def together(*calls):
    """Run the calls concurrently (the server batches them: fewer decode steps in all)."""
    with ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(c) for c in calls]
        return [f.result() for f in futures]


def test_named_function_streamed_matches_non_streamed(oai):
    kw = dict(model="m", messages=ASK, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}},
              temperature=0, max_tokens=30)
    whole, chunks = together(lambda: oai.chat.completions.create(**kw),
                             lambda: list(oai.chat.completions.create(**kw, stream=True)))
    [call] = assert_valid_calls(whole.choices[0])
    assert call.function.name == "get_time"
    state = ChatCompletionStreamState(input_tools=TOOLS)
    for ch in chunks:
        state.handle_chunk(ch)
    rebuilt = state.get_final_completion().choices[0]
    assert rebuilt.finish_reason == "tool_calls"
    [got] = rebuilt.message.tool_calls
    assert (got.function.name, got.function.arguments) == ("get_time", call.function.arguments)
    first = [d for ch in chunks for d in (ch.choices[0].delta.tool_calls or []) if d.id]
    assert len(first) == 1 and first[0].index == 0 and first[0].function.name == "get_time"


WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def _few_shot() -> list[dict]:
    def call(i: int, city: str) -> dict:
        fn = {"name": "weather", "arguments": json.dumps({"city": city})}
        return {"role": "assistant", "content": None,
                "tool_calls": [{"id": f"call_{i}", "type": "function", "function": fn}]}
    return [{"role": "user", "content": "Weather in Paris?"}, call(1, "Paris"),
            {"role": "user", "content": "Weather in Rome?"}, call(2, "Rome"),
            {"role": "user", "content": "Weather in London?"}]


def test_auto_parses_calls_streamed_and_not(oai):
    """SmolLM2 imitates the calls of a few-shot history (Hermes format, parsed from free text)."""
    kw = dict(model="m", messages=_few_shot(), tools=[WEATHER], temperature=0, max_tokens=32, parallel_tool_calls=False)

    def streamed():
        with oai.chat.completions.stream(**kw) as stream:
            for _ in stream:
                pass
            return stream.get_final_completion().choices[0]

    whole, final, none = together(lambda: oai.chat.completions.create(**kw), streamed,
                                  lambda: oai.chat.completions.create(**{**kw, "tool_choice": "none", "max_tokens": 4}))
    [call] = whole.choices[0].message.tool_calls
    assert whole.choices[0].finish_reason == "tool_calls" and whole.choices[0].message.content is None
    assert call.function.name == "weather" and json.loads(call.function.arguments) == {"city": "London"}
    assert final.finish_reason == "tool_calls"
    assert [(c.function.name, c.function.arguments) for c in final.message.tool_calls] == \
        [(call.function.name, call.function.arguments)]
    assert none.choices[0].message.tool_calls is None and none.choices[0].finish_reason == "length"


def test_tool_result_round_trip(oai, smol_dir, required_t0):
    from transformers import AutoTokenizer

    from radixserve.tools.prompt import hermes_messages

    msg = required_t0.choices[0].message
    call = msg.tool_calls[0]
    convo = [*ASK, msg.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"forecast": "sunny, 24C"})}]
    second = oai.chat.completions.create(model="m", messages=convo, tools=TOOLS, temperature=0, max_tokens=4)
    assert second.choices[0].finish_reason in ("stop", "length", "tool_calls")
    tok = AutoTokenizer.from_pretrained(smol_dir)
    text = tok.apply_chat_template(hermes_messages(convo, TOOLS), tokenize=False, add_generation_prompt=True)
    assert "<tool_response>\n" in text and f'"name": "{call.function.name}"' in text
    assert second.usage.prompt_tokens == len(tok.encode(text, add_special_tokens=False))


@pytest.mark.parametrize("kw,field", [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "x": {"type": "strange"}}}}}], "tool_choice": "required"},
     "tools.0.function.parameters"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools.0.function.name"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages.0.tool_call_id"),
])
def test_bad_tool_requests_name_the_field(oai, kw, field):
    body = {"model": "m", "messages": ASK, "max_tokens": 4, **kw}
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(**body)
    assert e.value.body["message"].startswith(field + ":"), e.value.body
