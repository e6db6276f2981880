"""/v1/responses through the official ``openai`` client (tiny random Llama, greedy): text and message
input against the chat route's rendering, streaming events, function tools and their outputs in the
next turn, ``text.format`` JSON schema, ``previous_response_id`` served from the radix cache, stored
responses (in ``--usage-db``'s SQLite file) with retrieve / delete, and the 400 / 404 answers.

Random weights rarely stop on their own, so a plain answer runs to ``max_output_tokens`` and is
``incomplete``; a constrained one (JSON schema, a forced tool call) completes."""
from __future__ import annotations

import json
import sqlite3

import jsonschema
import openai
import pytest

from tests.helpers.server_harness import API_KEY, ServerHandle

M = "tiny-resp"
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Oslo", "Lima"]}},
           "required": ["city"], "additionalProperties": False}
TOOLS = [{"type": "function", "name": "get_weather", "description": "The weather in a city",
          "parameters": WEATHER, "strict": True}]
ANSWER = {"type": "object", "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["answer"], "additionalProperties": False}
JSON_TEXT = {"format": {"type": "json_schema", "name": "answer", "schema": ANSWER, "strict": True}}


@pytest.fixture(scope="module")
def db_path(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("responses_db") / "usage.sqlite")


@pytest.fixture(scope="module")
def server(tiny_dir, db_path):
    srv = ServerHandle(tiny_dir, "--max-total-tokens", "8192", "--served-model-name", M, "--usage-db", db_path,
                       api_key=API_KEY).wait_ready()
    yield srv
    srv.stop()


def _strip(value):
    """``value`` without fresh ids and the client's parsed-output fields, at any depth."""
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in ("id", "call_id", "parsed", "parsed_arguments")}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _same_items(a, b) -> None:
    """Output items equal but for their fresh ids."""
    assert _strip([it.to_dict() for it in a]) == _strip([it.to_dict() for it in b])


def test_text_input_renders_as_chat_does(oai):
    r = oai.responses.create(model=M, input="The capital of France is", max_output_tokens=8, temperature=0)
    chat = oai.chat.completions.create(model=M, messages=[{"role": "user", "content": "The capital of France is"}],
                                       max_tokens=8, temperature=0)
    assert r.id.startswith("resp_") and r.object == "response" and r.model == M
    assert [o.type for o in r.output] == ["message"] and r.output[0].role == "assistant"
    assert r.output_text == chat.choices[0].message.content
    assert r.usage.input_tokens == chat.usage.prompt_tokens and r.usage.output_tokens == chat.usage.completion_tokens
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")
    if r.status == "incomplete":
        assert r.incomplete_details.reason == "max_output_tokens"


def test_messages_and_instructions(oai):
    turns = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
             {"role": "user", "content": [{"type": "input_text", "text": "Name "}, {"type": "input_text", "text": "a cat."}]}]
    r = oai.responses.create(model=M, input=turns, instructions="Answer briefly.", max_output_tokens=6, temperature=0)
    flat = [*turns[:2], {"role": "user", "content": "Name a cat."}]
    chat = oai.chat.completions.create(model=M, messages=[{"role": "system", "content": "Answer briefly."}, *flat],
                                       max_tokens=6, temperature=0)
    assert r.output_text == chat.choices[0].message.content and r.instructions == "Answer briefly."
    assert r.usage.input_tokens == chat.usage.prompt_tokens


def test_stream_events_and_final_response(oai):
    kw = dict(model=M, input="What is six times seven?", text=JSON_TEXT, max_output_tokens=30, temperature=0)
    whole = oai.responses.create(**kw)
    assert whole.status == "completed"
    jsonschema.validate(json.loads(whole.output_text), ANSWER)
    with oai.responses.stream(**kw) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text
    assert final.output_text == whole.output_text and final.usage.output_tokens == whole.usage.output_tokens
    _same_items(final.output, whole.output)


def test_stream_cut_by_the_limit_ends_incomplete(oai):
    kw = dict(model=M, input="Tell me a story.", max_output_tokens=10, temperature=0)
    whole = oai.responses.create(**kw)
    events = list(oai.responses.create(**kw, stream=True))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text
    last = events[-1]
    assert last.type == f"response.{whole.status}" and last.response.status == whole.status
    assert last.response.output[0].content[0].text == whole.output_text


def test_forced_tool_call_and_its_output_in_the_next_turn(oai):
    ask = [{"role": "user", "content": "What is the weather in Oslo?"}]
    kw = dict(model=M, tools=TOOLS, max_output_tokens=40, temperature=0)
    r = oai.responses.create(input=ask, tool_choice={"type": "function", "name": "get_weather"}, **kw)
    (call,) = r.output
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    assert r.status == "completed" and r.output_text == ""
    # the same call streamed (tool_choice required: one call of any tool)
    with oai.responses.stream(input=ask, tool_choice="required", parallel_tool_calls=False, **kw) as s:
        events = list(s)
        final = s.get_final_response()
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
    assert [(o.type, o.name, o.arguments) for o in final.output] == [("function_call", call.name, call.arguments)]
    # turn 2 by id, and the same conversation sent whole: one prompt, one answer
    result = {"type": "function_call_output", "call_id": call.call_id, "output": json.dumps({"sky": "sunny"})}
    by_id = oai.responses.create(previous_response_id=r.id, input=[result], **kw)
    echoed = oai.responses.create(input=[*ask, call.model_dump(exclude_none=True), result], store=False, **kw)
    assert by_id.usage.input_tokens == echoed.usage.input_tokens > r.usage.input_tokens
    assert by_id.output_text == echoed.output_text and by_id.previous_response_id == r.id
    assert by_id.usage.input_tokens_details.cached_tokens >= r.usage.input_tokens - 1


def test_text_format_json_schema_and_json_object(oai):
    r = oai.responses.create(model=M, input="Pick a number.", text=JSON_TEXT, max_output_tokens=30, temperature=0)
    jsonschema.validate(json.loads(r.output_text), ANSWER)
    assert r.text.format.type == "json_schema"
    obj = oai.responses.create(model=M, input="A JSON object please.", text={"format": {"type": "json_object"}},
                               max_output_tokens=30, temperature=0)
    if obj.status == "completed":
        assert isinstance(json.loads(obj.output_text), dict)
    else:
        assert obj.output_text.startswith("{")
    with pytest.raises(openai.BadRequestError, match="text.format: cannot be combined with tool_choice"):
        oai.responses.create(model=M, input="x", text=JSON_TEXT, tools=TOOLS, tool_choice="required")


def test_previous_response_id_reuses_the_earlier_turns_from_the_cache(oai, db_path):
    first = oai.responses.create(model=M, input="Tell me about cats.", max_output_tokens=8, temperature=0)
    second = oai.responses.create(model=M, previous_response_id=first.id, input="And dogs?", max_output_tokens=8,
                                  temperature=0)
    # the continued prompt starts with the whole first prompt (its last token may merge with the reply's first)
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 1 > 0
    assert second.usage.input_tokens > first.usage.input_tokens + 2
    replay = [{"role": "user", "content": "Tell me about cats."}, *[o.model_dump(exclude_none=True) for o in first.output],
              {"role": "user", "content": "And dogs?"}]
    same = oai.responses.create(model=M, input=replay, max_output_tokens=8, temperature=0, store=False)
    assert same.usage.input_tokens == second.usage.input_tokens and same.output_text == second.output_text
    third = oai.responses.create(model=M, previous_response_id=second.id, input="Which is better?",
                                 max_output_tokens=4, temperature=0)
    assert third.usage.input_tokens_details.cached_tokens >= second.usage.input_tokens - 1
    with sqlite3.connect(db_path) as db:  # kept in the server's database file
        ids = {row[0] for row in db.execute("SELECT id FROM responses")}
    assert {first.id, second.id, third.id} <= ids and same.id not in ids


def test_retrieve_delete_and_store_false(oai):
    r = oai.responses.create(model=M, input="Hello", max_output_tokens=4, temperature=0, metadata={"k": "v"})
    got = oai.responses.retrieve(r.id)
    assert got.model_dump() == r.model_dump() and got.metadata == {"k": "v"}
    oai.responses.delete(r.id)
    for call in (lambda: oai.responses.retrieve(r.id), lambda: oai.responses.delete(r.id),
                 lambda: oai.responses.create(model=M, previous_response_id=r.id, input="x", max_output_tokens=2)):
        with pytest.raises(openai.NotFoundError, match=r.id):
            call()
    gone = oai.responses.create(model=M, input="Hello", max_output_tokens=2, store=False)
    assert gone.store is False
    with pytest.raises(openai.NotFoundError, match=gone.id):
        oai.responses.retrieve(gone.id)


def test_errors_name_the_field_or_the_model(oai):
    with pytest.raises(openai.BadRequestError, match="max_output_tokenz: unknown field"):
        oai.responses.create(model=M, input="x", extra_body={"max_output_tokenz": 3})
    with pytest.raises(openai.BadRequestError, match=r"input\.0: unsupported item type"):
        oai.responses.create(model=M, input=[{"type": "web_search_call", "id": "ws_1", "status": "completed"}])
    with pytest.raises(openai.BadRequestError, match="tool_choice.name: 'nope' is not one of the tools"):
        oai.responses.create(model=M, input="x", tools=TOOLS, tool_choice={"type": "function", "name": "nope"})
    with pytest.raises(openai.BadRequestError, match="max_output_tokens: must be >= 0"):
        oai.responses.create(model=M, input="x", max_output_tokens=-1)
    with pytest.raises(openai.BadRequestError, match="background: background responses are not supported"):
        oai.responses.create(model=M, input="x", background=True)
    with pytest.raises(openai.NotFoundError, match="model: the model `no-such-model` does not exist"):
        oai.responses.create(model="no-such-model", input="x")
