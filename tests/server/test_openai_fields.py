"""The OpenAI routes' field lists (radixserve/server/openai_fields.py) against the request models and
against the official ``openai`` package's parameter types; the unknown-field message; the model
names (``lora_routes.adapter_of_model``); ``--served-model-name`` and ``--chat-template`` checks.
No server: these run in milliseconds."""
from __future__ import annotations

import json
import types

import pytest
from pydantic import BaseModel, ValidationError

from radixserve.chat_template import load_chat_template
from radixserve.config import ServerConfig
from radixserve.server import openai_fields as F
from radixserve.server.lora_routes import adapter_of_model
from radixserve.server.openai.embeddings import EmbeddingRequest
from radixserve.server.protocol import (ChatCompletionRequest, ChatMessage, CompletionRequest, ContentPart,
                                        JsonSchemaFormat, ResponseFormat, StreamOptions)
from radixserve.server.req_state import RequestError
from radixserve.tools.protocol import FunctionDef, NamedToolChoice, ToolCall, ToolDef
from radixserve.validation import validation_message

MODELS: dict[type[BaseModel], frozenset[str]] = {
    ChatCompletionRequest: F.accepted(F.CHAT_OPENAI, F.CHAT_EXTENSIONS, F.CHAT_IGNORED),
    CompletionRequest: F.accepted(F.COMPLETION_OPENAI, F.COMPLETION_EXTENSIONS, F.COMPLETION_IGNORED),
    EmbeddingRequest: F.accepted(F.EMBEDDING_OPENAI, F.EMBEDDING_EXTENSIONS, F.EMBEDDING_IGNORED),
    ChatMessage: F.accepted(F.MESSAGE_FIELDS, F.MESSAGE_IGNORED),
    ContentPart: F.accepted(F.CONTENT_PART_FIELDS, F.CONTENT_PART_IGNORED),
    StreamOptions: F.accepted(F.STREAM_OPTIONS_FIELDS, F.STREAM_OPTIONS_IGNORED),
    ResponseFormat: F.accepted(F.RESPONSE_FORMAT_FIELDS),
    JsonSchemaFormat: F.accepted(F.JSON_SCHEMA_FORMAT_FIELDS),
}


def names(model: type[BaseModel]) -> set[str]:
    """The keys ``model`` takes in a JSON body (aliases where a field has one)."""
    return {f.alias or name for name, f in model.model_fields.items()}


@pytest.mark.parametrize("model", list(MODELS), ids=lambda m: m.__name__)
def test_each_model_takes_exactly_its_listed_fields(model):
    listed = MODELS[model]
    assert not names(model) - listed, (f"{model.__name__} has fields radixserve/server/openai_fields.py does not "
                                       f"list (a new SamplingParams field? list it, or exclude it from the "
                                       f"OpenAI routes in protocol.OPENAI_EXCLUDED): {sorted(names(model) - listed)}")
    assert not listed - names(model), f"openai_fields.py lists what {model.__name__} lacks: {listed - names(model)}"
    assert model.model_config.get("extra") == "forbid", f"{model.__name__} must refuse unknown fields"


@pytest.mark.parametrize("model", [ToolDef, FunctionDef, NamedToolChoice, ToolCall], ids=lambda m: m.__name__)
def test_the_tool_shapes_refuse_unknown_keys(model):
    assert model.model_config.get("extra") == "forbid"


def _typed_dict_keys(*types_: type) -> set[str]:
    """Every key of the TypedDicts ``types_`` (the client's request parameters)."""
    return {k for t in types_ for k in (*t.__required_keys__, *t.__optional_keys__)}


def test_every_parameter_of_the_official_client_is_accepted():
    """What ``openai`` can send is taken: a newer client's new field fails here, not at a user's."""
    from openai.types import completion_create_params as comp, embedding_create_params as emb
    from openai.types.chat import chat_completion_content_part_param as part, completion_create_params as chat
    from openai.types.chat import chat_completion_stream_options_param as so
    import openai.types.chat as t
    from openai.types.shared_params import function_definition as fd, response_format_json_schema as rf

    assert _typed_dict_keys(chat.CompletionCreateParamsBase) | {"stream"} <= names(ChatCompletionRequest)
    assert _typed_dict_keys(comp.CompletionCreateParamsBase) | {"stream"} <= names(CompletionRequest)
    assert _typed_dict_keys(emb.EmbeddingCreateParams) <= names(EmbeddingRequest)
    roles = [t.ChatCompletionSystemMessageParam, t.ChatCompletionUserMessageParam, t.ChatCompletionDeveloperMessageParam,
             t.ChatCompletionAssistantMessageParam, t.ChatCompletionToolMessageParam]
    assert _typed_dict_keys(*roles) <= names(ChatMessage)
    parts = [t.ChatCompletionContentPartTextParam, t.ChatCompletionContentPartImageParam,
             t.ChatCompletionContentPartInputAudioParam, t.ChatCompletionContentPartRefusalParam, part.File]
    assert _typed_dict_keys(*parts) <= names(ContentPart)
    assert _typed_dict_keys(so.ChatCompletionStreamOptionsParam) <= names(StreamOptions)
    assert _typed_dict_keys(fd.FunctionDefinition) <= names(FunctionDef)
    assert _typed_dict_keys(rf.JSONSchema) <= names(JsonSchemaFormat)
    assert _typed_dict_keys(t.ChatCompletionMessageToolCallParam) <= names(ToolCall)


def _message(model: type[BaseModel], body: str) -> str:
    with pytest.raises(ValidationError) as e:
        model.model_validate_json(body, strict=True)
    return validation_message(list(e.value.errors()), names(model))


def test_an_unknown_field_is_named_with_the_closest_known_one():
    msgs = '"messages": [{"role": "user", "content": "hi"}]'
    assert _message(ChatCompletionRequest, '{%s, "temprature": 0.5}' % msgs) == \
        "temprature: unknown field (did you mean 'temperature'?)"
    assert _message(CompletionRequest, '{"prompt": "x", "max_tokenz": 3}') == \
        "max_tokenz: unknown field (did you mean 'max_tokens'?)"
    assert _message(EmbeddingRequest, '{"input": "x", "zzz": 1}') == "zzz: unknown field"
    # nested, inside a union (content: a string or parts): the branch that has the key is the one named
    bad_part = '{"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "imag_url": 1}]}]}'
    assert _message(ChatCompletionRequest, bad_part) == "messages.0.content.0.imag_url: unknown field"
    tool = '{%s, "tools": [{"type": "function", "function": {"name": "f", "paramters": {}}}]}' % msgs
    assert _message(ChatCompletionRequest, tool) == "tools.0.function.paramters: unknown field"
    fmt = '{%s, "response_format": {"type": "json_object", "schema": {}}}' % msgs
    assert _message(ChatCompletionRequest, fmt) == "response_format.schema: unknown field"
    opts = '{%s, "stream_options": {"include_usage": true, "continuous_usage_stats": true}}' % msgs
    assert _message(ChatCompletionRequest, opts) == "stream_options.continuous_usage_stats: unknown field"
    # a wrong type is still reported as before
    assert _message(ChatCompletionRequest, '{%s, "temperature": "hot"}' % msgs).startswith("temperature: ")


def test_ignored_and_extension_fields_parse():
    body = {"messages": [{"role": "assistant", "content": "x", "refusal": None, "reasoning_content": "r",
                          "tool_calls": [{"id": "1", "type": "function", "index": 0,
                                          "function": {"name": "f", "arguments": "{}"}}]}],
            "store": True, "metadata": {"k": "v"}, "service_tier": "auto", "continue_final_message": True,
            "chat_template_kwargs": {"enable_thinking": False}, "separate_reasoning": False, "json_schema": "{}"}
    req = ChatCompletionRequest.model_validate_json(json.dumps(body), strict=True)
    assert req.continue_final_message and req.chat_template_kwargs == {"enable_thinking": False}
    assert "index" not in req.messages[0].tool_calls[0].model_dump()  # never reaches the chat template


# ------------------------------------------------------------------ model names


def _ctx(served: tuple[str, ...] = (), adapters: tuple[str, ...] | None = None) -> types.SimpleNamespace:
    lora = None
    if adapters is not None:
        lora = types.SimpleNamespace(adapters={a: object() for a in adapters},
                                     known=lambda: "loaded: " + (", ".join(adapters) or "none"))
    return types.SimpleNamespace(tm=types.SimpleNamespace(lora=lora), model_name="tiny", model_path="/m/tiny",
                                 server_cfg=ServerConfig(served_model_name=served))


def _status(ctx: types.SimpleNamespace, model: str) -> int | str | None:
    try:
        return adapter_of_model(ctx, model)
    except RequestError as e:
        assert e.message.startswith("model: ") and f"`{model}`" in e.message, e.message
        return e.status


def test_any_model_name_is_the_base_model_while_names_mean_nothing():
    ctx = _ctx()
    assert [_status(ctx, m) for m in ("default", "gpt-3.5-turbo", "tiny", "", None)] == [None] * 5


def test_names_mean_something_with_lora_or_served_names():
    lora = _ctx(adapters=("a",))
    assert [_status(lora, m) for m in ("a", "tiny", "/m/tiny", "tiny:a", "/m/tiny:a", None)] == \
        ["a", None, None, "a", "a", None]
    assert [_status(lora, m) for m in ("no-such-adapter", "tiny:no-such-adapter", "default")] == [404] * 3
    served = _ctx(served=("alpha", "beta"))
    assert [_status(served, m) for m in ("alpha", "beta", "tiny", "alpha:a")] == [None, None, 404, 404]
    both = _ctx(served=("alpha",), adapters=("a",))
    assert [_status(both, m) for m in ("alpha:a", "a", "tiny:a", "alpha:b")] == ["a", "a", 404, 404]
    with pytest.raises(RequestError, match=r"served: alpha; adapters loaded: a"):
        adapter_of_model(both, "nope")


# ------------------------------------------------------------------ --served-model-name, --chat-template


@pytest.mark.parametrize("names", [("",), ("a", "a"), (" a",)])
def test_bad_served_names_are_refused(names):
    with pytest.raises(ValueError, match="served_model_name"):
        ServerConfig(served_model_name=names)


def test_a_chat_template_is_a_file_or_the_template_itself(tmp_path):
    good = "{% for m in messages %}{{ m.content }}{% endfor %}"
    path = tmp_path / "t.jinja"
    path.write_text(good)
    assert load_chat_template(str(path)) == good and ServerConfig(chat_template=str(path)).chat_template == str(path)
    assert load_chat_template(good + "\\n") == good + "\n"  # an escaped newline, as a shell passes it
    assert load_chat_template("{% generation %}{{ x }}{% endgeneration %}")  # transformers' tag
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}\n{{ m.content }")
    for value, words in ((str(bad), f"{bad}: line 2"), (str(tmp_path / "missing.jinja"), "neither a readable file"),
                         (str(tmp_path), "Is a directory"), ("{{ x", "the template given: line 1")):
        with pytest.raises(ValueError, match="^chat_template: ") as e:
            ServerConfig(chat_template=value)
        assert words in str(e.value), str(e.value)
