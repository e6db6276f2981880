"""Tool calling without a server: the JSON scanner, each format's parser (complete, partial
and malformed text), the streaming delta logic (rebuilt by the official ``openai`` package's
stream accumulator), the constraint schemas of tool_spec.py and the Hermes rendering."""
from __future__ import annotations

import json

import jsonschema
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from radixserve.tools.json_scan import DONE, INVALID, PARTIAL, scan_call, scan_calls
from radixserve.tools.parsers import detect_format, make_parser
from radixserve.tools.prompt import hermes_messages
from radixserve.tools.protocol import NamedToolChoice
from radixserve.tools.spec import check_tools, plan_tools
from radixserve.tools.stream import ToolCallStream, finish_reason

W = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
HERMES = ('Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
          '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Ro}me"}}\n</tool_call>')


def calls_of(parsed):
    return [(c.name, c.args) for c in parsed.calls]


def test_scan_call_partial_done_invalid():
    text = '{"name": "f", "arguments": {"a": [1, {"b": "x}"}]}}'
    for k in range(len(text)):
        assert scan_call(text[:k], 0).status == PARTIAL, text[:k]
    done = scan_call(text, 0)
    assert (done.status, done.name, done.args, done.end) == (DONE, "f", '{"a": [1, {"b": "x}"}]}', len(text))
    assert scan_call('{"arguments": {}, "name": "f"}', 0).name == "f"  # any key order
    for bad in ('x', '{"name": 3, "arguments": {}}', '{"name": "f"}', '{"name": "f", "arguments": {"a": }}',
                '{"name" "f"}', '{"name": "f" "arguments": {}}', '{, "name": "f", "arguments": {}}'):
        assert scan_call(bad, 0).status == INVALID, bad
    calls, status = scan_calls('[{"name": "a", "arguments": {}}, {"name": "b", "argu')
    assert status == PARTIAL and [c.name for c in calls] == ["a", "b"] and calls[1].status == PARTIAL


def test_hermes_parser():
    p = make_parser("hermes", {"get_weather"})
    out = p.parse(HERMES, final=True)
    assert out.content == "Let me check."
    assert calls_of(out) == [("get_weather", '{"city": "Paris"}'), ("get_weather", '{"city": "Ro}me"}')]
    assert p.parse("no calls here ", final=True).content == "no calls here "
    assert p.parse("Hi <tool_", final=False).content == "Hi"  # may become the marker: held back
    assert p.parse("Hi <tools>", final=False).content == "Hi <tools>"
    unknown = '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>'
    assert p.parse(unknown, final=True).calls == [] and p.parse(unknown, final=True).content == unknown
    truncated = HERMES[:HERMES.rindex("Ro")]
    assert len(p.parse(truncated, final=True).calls) == 1  # the unfinished second call is dropped
    garbage = '<tool_call>{"name": "get_weather", "arguments": {"city": "X"}} trailing</tool_call>'
    assert p.parse(garbage, final=True).calls == []
    no_close = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "X"}}\n'
    assert calls_of(p.parse(no_close, final=True)) == [("get_weather", '{"city": "X"}')]


def test_llama3_mistral_json_parsers():
    l3 = make_parser("llama3", {"f", "g"})
    text = '<|python_tag|>{"name": "f", "parameters": {"x": 1}}; {"name": "g", "parameters": {}}'
    assert calls_of(l3.parse(text, final=True)) == [("f", '{"x": 1}'), ("g", "{}")]
    assert l3.parse(text, final=True).content == ""
    assert l3.parse('{"name": "f", "parameters": {}} and text', final=True).calls == []
    assert l3.parse("Plain answer", final=True).content == "Plain answer"
    assert l3.parse("<|python", final=False).content == ""
    assert l3.parse('{"name": "f", "param', final=False).calls[0].name == "f"
    assert l3.parse('{"name": "zzz", "parameters": {}}', final=True).calls == []
    mi = make_parser("mistral", {"f"})
    out = mi.parse('ok [TOOL_CALLS] [{"name": "f", "arguments": {"a": "]"}}]', final=True)
    assert out.content == "ok" and calls_of(out) == [("f", '{"a": "]"}')]
    js = make_parser("json", {"f"})
    assert calls_of(js.parse('{"name":"f","arguments":{"a":1}}', final=True)) == [("f", '{"a":1}')]
    cut = '[{"name":"f","arguments":{"a":1}},{"name":"f","arguments":{"a'
    assert len(js.parse(cut, final=True).calls) == 1
    assert js.parse('[{"name":"f","argu', final=True).content == '[{"name":"f","argu'


def test_detect_format():
    assert detect_format(None) is None and detect_format("{{ messages }}") is None
    assert detect_format("{% if tools %}<tool_call>{% endif %}") == "hermes"
    assert detect_format("{% if tools %}<|python_tag|>{% endif %}") == "llama3"
    assert detect_format("{% if tools %}[TOOL_CALLS]{% endif %}") == "mistral"


def chunks_of(text: str, fmt: str, step: int) -> tuple[list[dict], ToolCallStream]:
    """The OpenAI chunks a stream of ``text`` in pieces of ``step`` characters gives."""
    stream = ToolCallStream(make_parser(fmt, {"get_weather"}))
    out = []
    for k in list(range(1, len(text), step)) + [len(text)]:
        final = k == len(text)
        content, calls = stream.step(text[:k], final)
        delta = {"role": "assistant"} if not out else {}
        if content:
            delta["content"] = content
        if calls:
            delta["tool_calls"] = calls
        reason = finish_reason("stop", stream.called) if final else None
        out.append({"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
                    "choices": [{"index": 0, "delta": delta, "finish_reason": reason}]})
    return out, stream


@pytest.mark.parametrize("step", [1, 3, 50])
@pytest.mark.parametrize("fmt,text", [("hermes", HERMES), ("json", '[{"name":"get_weather","arguments":'
                                                          '{"city":"Paris"}},{"name":"get_weather","arguments":{}}]')])
def test_stream_deltas_rebuild_the_message(fmt, text, step):
    chunks, _ = chunks_of(text, fmt, step)
    state = ChatCompletionStreamState(input_tools=[W])
    for ch in chunks:
        state.handle_chunk(ChatCompletionChunk.model_validate(ch))
    final = state.get_final_completion().choices[0]
    content, calls = ToolCallStream(make_parser(fmt, {"get_weather"})).message(text)
    assert final.finish_reason == "tool_calls"
    assert (final.message.content or None) == content
    got = [(c.function.name, c.function.arguments) for c in final.message.tool_calls]
    assert got == [(c["function"]["name"], c["function"]["arguments"]) for c in calls]
    firsts = [d for ch in chunks for d in ch["choices"][0]["delta"].get("tool_calls", []) if "id" in d]
    assert [d["index"] for d in firsts] == [0, 1] and all(d["id"].startswith("call_") for d in firsts)


def test_stream_without_calls_is_plain_text():
    chunks, stream = chunks_of("Paris is sunny <3", "hermes", 2)
    text = "".join(ch["choices"][0]["delta"].get("content", "") for ch in chunks)
    assert text == "Paris is sunny <3" and not stream.called
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert finish_reason("length", True) == "length"


def test_plan_tools_and_schemas():
    tools = check_tools([W, {"type": "function", "function": {"name": "noop"}}])
    assert plan_tools(None, None, None).mode == "none" and plan_tools(tools, None, None).mode == "auto"
    assert plan_tools(tools, "none", None).tools == []
    req = plan_tools(tools, "required", None).schema
    ok = [{"name": "get_weather", "arguments": {"city": "X"}}, {"name": "noop", "arguments": {}}]
    jsonschema.validate(ok, req)
    for bad in ([], [{"name": "get_weather", "arguments": {}}], [{"name": "other", "arguments": {}}],
                [{"name": "noop", "arguments": {"x": 1}}]):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, req)
    one = plan_tools(tools, "required", False).schema
    jsonschema.validate(ok[0], one)
    choice = NamedToolChoice.model_validate({"type": "function", "function": {"name": "noop"}})
    plan = plan_tools(tools, choice, None)
    assert plan.mode == "named" and plan.schema["properties"]["name"] == {"const": "noop"}


def test_refs_are_hoisted_and_errors_name_the_field():
    params = {"type": "object", "properties": {"p": {"$ref": "#/$defs/P"}}, "required": ["p"],
              "$defs": {"P": {"type": "integer", "minimum": 0}}}
    tools = check_tools([{"type": "function", "function": {"name": "f", "parameters": params}}])
    schema = plan_tools(tools, "required", False).schema
    assert "tool0_P" in schema["$defs"]
    jsonschema.validate({"name": "f", "arguments": {"p": 3}}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "f", "arguments": {"p": -1}}, schema)
    bad_ref = check_tools([W, {"type": "function", "function": {"name": "g", "parameters": {"$ref": "http://x"}}}])
    with pytest.raises(ValueError, match=r"^tools\.1\.function\.parameters: "):
        plan_tools(bad_ref, "required", None)
    with pytest.raises(ValueError, match=r"^tools\.1\.function\.name: duplicate"):
        plan_tools(check_tools([W, W]), "auto", None)
    with pytest.raises(ValueError, match=r"^tool_choice: needs tools"):
        plan_tools([], "required", None)
    with pytest.raises(ValueError, match=r"^tools\.0\.function"):
        check_tools([{"type": "function", "function": {"name": "bad name!"}}])


def test_hermes_rendering_of_a_round_trip():
    msgs = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {
                "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "21C"},
            {"role": "tool", "tool_call_id": "call_2", "content": "22C"}]
    out = hermes_messages(msgs, [W])
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert "<tools>\n" + json.dumps(W) + "\n</tools>" in out[0]["content"]
    assert out[2]["content"] == '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert out[3]["content"] == "<tool_response>\n21C\n</tool_response>\n<tool_response>\n22C\n</tool_response>"
    with_system = hermes_messages([{"role": "system", "content": "Be brief."}, msgs[0]], [W])
    assert with_system[0]["content"].startswith("Be brief.\n\n# Tools")


@pytest.mark.parametrize("fmt", ["hermes", "llama3", "mistral", "json"])
def test_random_texts_stream_consistently(fmt):
    """Whatever the text (calls, unknown names, garbage, cut anywhere) and however it is split,
    the streamed content is a prefix of the final content and every final call's streamed
    arguments are exactly its final arguments."""
    import random

    rng = random.Random(fmt)
    call = '{"name": "get_weather", "arguments": {"city": "P\\"a}ris", "n": [1, 2]}}'
    pieces = {"hermes": ["Hi ", "<tool_call>\n" + call + "\n</tool_call>\n", "<tool_", "oops {", " ",
                         '<tool_call>{"name": "zz", "arguments": {}}</tool_call>'],
              "llama3": ["<|python_tag|>", call.replace("arguments", "parameters"), "; ", "text", " "],
              "mistral": ["ok ", "[TOOL_CALLS] [", call, ", ", "]", "x"],
              "json": ["[", call, ",", "]", " ", '{"na']}[fmt]
    for _ in range(150):
        text = "".join(rng.choice(pieces) for _ in range(rng.randrange(1, 6)))
        cuts = sorted(rng.sample(range(1, len(text) + 1), min(len(text), rng.randrange(1, 8))))
        stream = ToolCallStream(make_parser(fmt, {"get_weather"}))
        content, args = "", {}
        for k in [*cuts[:-1], len(text)]:
            c, deltas = stream.step(text[:k], k == len(text))
            content += c
            for d in deltas:
                args[d["index"]] = args.get(d["index"], "") + d["function"]["arguments"]
        final_content, calls = ToolCallStream(make_parser(fmt, {"get_weather"})).message(text)
        assert (final_content or "").startswith(content), (text, cuts)
        assert content == (final_content or "") or stream.called, (text, cuts)
        for i, c in enumerate(calls):
            assert args[i] == c["function"]["arguments"], (text, cuts)
            json.loads(c["function"]["arguments"])
