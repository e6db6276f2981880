"""Issue 47, item 5, on the real server through the official ``openai`` client: a misspelled field of
/v1/chat/completions, /v1/completions or /v1/embeddings (top level or nested) is a 400 naming it,
while every documented field and the extensions radixserve implements are taken (the session's
shared tiny-model server; the field lists: radixserve/server/openai_fields.py)."""
from __future__ import annotations

import uuid

import openai
import pytest

from tests.helpers.server_harness import shared_server

MSGS = [{"role": "user", "content": "Name a prime number."}]
GREEDY = {"max_tokens": 6, "temperature": 0}


@pytest.fixture(scope="module")
def server(tiny_dir):
    return shared_server(tiny_dir)


def _refused(call, param: str) -> str:
    with pytest.raises(openai.BadRequestError) as e:
        call()
    assert e.value.status_code == 400 and e.value.param == param, e.value.body
    assert e.value.type == "invalid_request_error" and param in e.value.message
    return e.value.message


def test_misspelled_fields_are_400s_naming_them(oai):
    chat, comp = oai.chat.completions.create, oai.completions.create
    msg = _refused(lambda: chat(model="m", messages=MSGS, **GREEDY, extra_body={"temprature": 0.5}), "temprature")
    assert "did you mean 'temperature'" in msg
    _refused(lambda: chat(model="m", messages=MSGS, extra_body={"max_tokenz": 5}), "max_tokenz")
    _refused(lambda: chat(model="m", messages=MSGS, stream=True, extra_body={"max_tokenz": 5}), "max_tokenz")
    assert "max_tokens" in _refused(lambda: comp(model="m", prompt="hi", extra_body={"max_tokenz": 5}), "max_tokenz")
    _refused(lambda: oai.embeddings.create(model="m", input="hi", extra_body={"dimension": 3}), "dimension")
    # SGLang's and vLLM's fields that radixserve does not implement are unknown too, not ignored
    _refused(lambda: chat(model="m", messages=MSGS, extra_body={"guided_json": {"type": "object"}}), "guided_json")


def test_nested_unknown_keys_are_named(oai):
    chat = oai.chat.completions.create
    parts = [{"role": "user", "content": [{"type": "text", "text": "x", "documnet": True}]}]
    _refused(lambda: chat(model="m", messages=parts, **GREEDY), "messages.0.content.0.documnet")
    _refused(lambda: chat(model="m", messages=[{"role": "user", "content": "x", "nme": "bob"}], **GREEDY),
             "messages.0.nme")
    tools = [{"type": "function", "function": {"name": "f", "paramters": {"type": "object"}}}]
    _refused(lambda: chat(model="m", messages=MSGS, tools=tools, **GREEDY), "tools.0.function.paramters")
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}, "strcit": True}}
    _refused(lambda: chat(model="m", messages=MSGS, response_format=fmt, **GREEDY), "response_format.json_schema.strcit")
    _refused(lambda: chat(model="m", messages=MSGS, stream=True, stream_options={"include_usage": True, "x": 1},
                          **GREEDY), "stream_options.x")


def test_documented_fields_are_taken_and_the_ignored_ones_change_nothing(oai):
    base = oai.chat.completions.create(model="m", messages=MSGS, **GREEDY).choices[0].message.content
    every = oai.chat.completions.create(
        model="m", messages=MSGS, **GREEDY, store=False, metadata={"k": "v"}, service_tier="auto", user="u",
        safety_identifier="s", prompt_cache_key="k", reasoning_effort="low", verbosity="low", modalities=["text"],
        prediction={"type": "content", "content": "2"}, web_search_options={}, n=1, seed=1, top_p=1.0,
        frequency_penalty=0.0, presence_penalty=0.0, logit_bias={}, logprobs=False, stream_options=None,
        max_completion_tokens=6)
    assert every.choices[0].message.content == base
    c = oai.completions.create(model="m", prompt="The capital of France is", best_of=1, echo=False, suffix="",
                               user="u", logprobs=None, **GREEDY)
    assert c.choices[0].finish_reason == "length"
    assert oai.embeddings.create(model="m", input="hi", user="u", encoding_format="float").data[0].embedding


def test_extension_fields_are_taken(oai):
    extra = {"top_k": 5, "min_p": 0.0, "repetition_penalty": 1.0, "min_tokens": 6, "ignore_eos": True,
             "skip_special_tokens": True, "stop_token_ids": [], "no_stop_trim": False, "priority": 1,
             "rid": uuid.uuid4().hex, "chat_template_kwargs": {"enable_thinking": False},
             "separate_reasoning": True, "continue_final_message": False}
    r = oai.chat.completions.create(model="m", messages=MSGS, **GREEDY, extra_body=extra)
    assert r.usage.completion_tokens == 6


def test_sglangs_json_schema_field_constrains_as_response_format_does(oai):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    want = oai.completions.create(model="m", prompt="Answer in JSON:", max_tokens=24, temperature=0,
                                  extra_body={"response_format": fmt}).choices[0].text
    assert want.startswith('{"a":')
    for value in (schema, '{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}'):
        got = oai.completions.create(model="m", prompt="Answer in JSON:", max_tokens=24, temperature=0,
                                     extra_body={"json_schema": value}).choices[0].text
        assert got == want
    _refused(lambda: oai.chat.completions.create(model="m", messages=MSGS, response_format=fmt,
                                                 extra_body={"json_schema": schema}), "json_schema")


def test_continue_final_message_continues_the_last_message(oai, tok):
    msgs = [{"role": "user", "content": "Name a prime number."}, {"role": "assistant", "content": "The answer is"}]
    r = oai.chat.completions.create(model="m", messages=msgs, **GREEDY, extra_body={"continue_final_message": True})
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False, continue_final_message=True)
    assert text.endswith("The answer is")
    assert r.usage.prompt_tokens == len(tok(text, add_special_tokens=False).input_ids)
    opened = oai.chat.completions.create(model="m", messages=msgs, **GREEDY)  # a new assistant turn: more tokens
    assert opened.usage.prompt_tokens > r.usage.prompt_tokens
