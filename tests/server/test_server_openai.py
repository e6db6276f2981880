"""The official ``openai`` client against the real server's /v1 routes (tiny model)."""
from __future__ import annotations

import openai
import pytest

from tests.helpers.server_harness import shared_server

MSGS = [{"role": "user", "content": "Name a prime number."}]


@pytest.fixture(scope="session")
def server(tiny_dir):
    return shared_server(tiny_dir)


def test_models_and_completions(oai, server):
    model = oai.models.list().data[0].id
    assert model == "tiny_llama" or model
    c = oai.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0)
    with server.client() as http:
        native = http.post("/generate", json={"text": "The capital of France is",
                                              "sampling_params": {"max_new_tokens": 8, "temperature": 0}}).json()
    assert c.choices[0].text == native["text"] and c.choices[0].finish_reason == "length"
    assert c.usage.completion_tokens == 8 and c.usage.prompt_tokens == native["meta_info"]["prompt_tokens"]
    assert c.usage.total_tokens == c.usage.prompt_tokens + 8
    assert c.usage.prompt_tokens_details.cached_tokens >= 0
    many = oai.completions.create(model=model, prompt=["a b c", "x y z"], max_tokens=4, n=2, seed=3,
                                  logprobs=2, temperature=1.0)
    assert [ch.index for ch in many.choices] == [0, 1, 2, 3]
    assert all(len(ch.logprobs.tokens) == 4 and len(ch.logprobs.top_logprobs[0]) == 2 for ch in many.choices)
    again = oai.completions.create(model=model, prompt=["a b c", "x y z"], max_tokens=4, n=2, seed=3,
                                   temperature=1.0)
    assert [ch.text for ch in again.choices] == [ch.text for ch in many.choices]


def test_completion_stream_with_usage(oai):
    full = oai.completions.create(model="m", prompt="Once upon a time", max_tokens=12, temperature=0)
    chunks = list(oai.completions.create(model="m", prompt="Once upon a time", max_tokens=12, temperature=0,
                                         stream=True, stream_options={"include_usage": True}))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == full.choices[0].text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12


def test_chat_and_chat_stream(oai):
    r = oai.chat.completions.create(model="m", messages=MSGS, max_completion_tokens=10, temperature=0,
                                    logprobs=True, top_logprobs=2)
    msg = r.choices[0].message
    assert msg.role == "assistant" and isinstance(msg.content, str)
    assert r.usage.completion_tokens == len(r.choices[0].logprobs.content) <= 10
    assert len(r.choices[0].logprobs.content[0].top_logprobs) == 2
    assert r.usage.prompt_tokens > 20  # the chat template wraps the message
    stream = oai.chat.completions.create(model="m", messages=MSGS, max_tokens=10, temperature=0, stream=True,
                                         stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == msg.content
    assert chunks[-1].usage.total_tokens == r.usage.total_tokens
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens >= r.usage.prompt_tokens - 1  # same prompt again
    finals = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finals == [r.choices[0].finish_reason]


def test_errors_are_openai_errors(oai, server):
    with pytest.raises(openai.BadRequestError) as e:
        oai.completions.create(model="m", prompt="hi", max_tokens=-1)
    assert "max_tokens" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="m", messages=MSGS, top_p=1.5)
    assert "top_p" in str(e.value)
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
