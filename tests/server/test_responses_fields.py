"""/v1/responses' request models (radixserve/server/openai/responses_protocol.py) against their field lists
(radixserve/server/openai_fields.py ``RESPONSES_*``) both ways, and against the official ``openai``
package's parameter types, so neither drifts; the item conversion to chat messages; the output
builder's events.  No server: these run in milliseconds."""
from __future__ import annotations

import json

import pytest
from pydantic import BaseModel, ValidationError

from radixserve.server import openai_fields as F
from radixserve.server.openai.responses_events import OutputBuilder
from radixserve.server.openai.responses_items import chat_messages, input_items
from radixserve.server.openai.responses_protocol import (FunctionCallItem, FunctionCallOutputItem, FunctionTool,
                                                         InputPart, MessageItem, ReasoningItem, ResponsesRequest,
                                                         TextFormat)
from radixserve.server.req_state import RequestError
from radixserve.tools.parsers import make_parser
from radixserve.validation import validation_message

MODELS: dict[type[BaseModel], frozenset[str]] = {
    ResponsesRequest: F.accepted(F.RESPONSES_OPENAI, F.RESPONSES_EXTENSIONS, F.RESPONSES_IGNORED),
    FunctionTool: F.accepted(F.RESPONSES_TOOL_FIELDS, F.RESPONSES_TOOL_IGNORED),
    InputPart: F.accepted(F.RESPONSES_CONTENT_PART_FIELDS, F.RESPONSES_CONTENT_PART_IGNORED),
}


def names(model: type[BaseModel]) -> set[str]:
    return {f.alias or name for name, f in model.model_fields.items()}


def keys(*types_: type) -> set[str]:
    return {k for t in types_ for k in (*t.__required_keys__, *t.__optional_keys__)}


@pytest.mark.parametrize("model", list(MODELS), ids=lambda m: m.__name__)
def test_each_model_takes_exactly_its_listed_fields(model):
    assert names(model) == MODELS[model], names(model) ^ MODELS[model]
    assert model.model_config.get("extra") == "forbid"


def test_every_parameter_of_the_official_client_is_accepted():
    from openai.types.responses import (easy_input_message_param as easy, function_tool_param as ft,
                                        response_create_params as rc, response_function_tool_call_param as fc,
                                        response_input_item_param as ii, response_input_text_param as it,
                                        response_output_message_param as om, response_output_text_param as ot,
                                        response_reasoning_item_param as ri,
                                        response_format_text_json_schema_config_param as js)

    assert keys(rc.ResponseCreateParamsBase) | {"stream"} <= names(ResponsesRequest)
    assert keys(ft.FunctionToolParam) <= names(FunctionTool)
    assert keys(easy.EasyInputMessageParam, ii.Message, om.ResponseOutputMessageParam) <= names(MessageItem)
    assert keys(fc.ResponseFunctionToolCallParam) <= names(FunctionCallItem)
    assert keys(ii.FunctionCallOutput) <= names(FunctionCallOutputItem)
    assert keys(ri.ResponseReasoningItemParam) <= names(ReasoningItem)
    assert keys(it.ResponseInputTextParam, ot.ResponseOutputTextParam) <= names(InputPart)
    assert keys(js.ResponseFormatTextJSONSchemaConfigParam) <= names(TextFormat)


def _message(body: dict) -> str:
    with pytest.raises(ValidationError) as e:
        ResponsesRequest.model_validate_json(json.dumps(body), strict=True)
    return validation_message(list(e.value.errors()), names(ResponsesRequest))


def test_unknown_fields_and_items_are_named():
    assert _message({"input": "x", "max_output_tokenz": 3}) == \
        "max_output_tokenz: unknown field (did you mean 'max_output_tokens'?)"
    assert _message({"input": [{"role": "user", "content": "x", "rol": 1}]}) == "input.0.rol: unknown field"
    assert _message({"input": [{"role": "user", "content": [{"type": "input_text", "text": "a", "txt": 1}]}]}) == \
        "input.0.content.0.txt: unknown field"
    assert _message({"input": "x", "tools": [{"type": "function", "name": "f", "paramters": {}}]}) == \
        "tools.0.paramters: unknown field"
    assert _message({"input": [{"type": "web_search_call", "id": "w"}]}).startswith("input.0: unsupported item type")


def test_items_become_the_chat_routes_messages():
    req = ResponsesRequest.model_validate({"instructions": "Be brief.", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in "}, {"type": "input_text", "text": "Oslo?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "hmm"}]},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}]},
        {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{\"city\": \"Oslo\"}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"}]})
    assert chat_messages(input_items(req), req.instructions) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "Let me look.", "reasoning_content": "hmm",
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "c1", "name": "weather"}]
    with pytest.raises(RequestError, match=r"^input\.0\.content\.0\.type: input_image parts are not supported"):
        chat_messages([{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}], None)
    with pytest.raises(RequestError, match=r"^input\.1\.call_id: required"):
        chat_messages([{"role": "user", "content": "x"}, {"type": "function_call_output", "output": "y"}], None)
    with pytest.raises(RequestError, match=r"^input: the conversation has no message"):
        chat_messages([], "only instructions")


def _stepped(builder: OutputBuilder, text: str, cuts: list[int]) -> list[dict]:
    for c in cuts:
        builder.step(text[:c], False)
    builder.step(text, True)
    return builder.take()


def test_streamed_items_equal_the_whole_ones_and_events_are_ordered():
    text = '[{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {}}]'
    whole = OutputBuilder(make_parser("json", {"f", "g"}), None)
    whole.step(text, True)
    streamed = OutputBuilder(make_parser("json", {"f", "g"}), None)
    events = _stepped(streamed, text, list(range(1, len(text), 3)))
    strip = [{k: v for k, v in it.items() if k not in ("id", "call_id")} for it in streamed.items]
    assert strip == [{k: v for k, v in it.items() if k not in ("id", "call_id")} for it in whole.items] == [
        {"type": "function_call", "name": "f", "arguments": '{"a": 1}', "status": "completed"},
        {"type": "function_call", "name": "g", "arguments": "{}", "status": "completed"}]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    kinds = [e["type"] for e in events if not e["type"].endswith(".delta")]
    assert kinds == ["response.output_item.added", "response.function_call_arguments.done", "response.output_item.done"] * 2
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    assert deltas == '{"a": 1}{}'


def test_a_plain_answer_is_one_message_and_an_empty_one_still_is():
    b = OutputBuilder(None, None)
    events = _stepped(b, "Hello there", [2, 5])
    assert [e["type"] for e in events] == [
        "response.output_item.added", "response.content_part.added", *["response.output_text.delta"] * 3,
        "response.output_text.done", "response.content_part.done", "response.output_item.done"]
    assert b.items[0]["content"][0]["text"] == "Hello there" and b.items[0]["status"] == "completed"
    empty = OutputBuilder(None, None)
    empty.step("", True, "incomplete")
    assert [(it["type"], it["content"][0]["text"], it["status"]) for it in empty.items] == [("message", "", "incomplete")]
