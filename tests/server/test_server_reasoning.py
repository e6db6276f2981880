"""Reasoning models over HTTP, through the official ``openai`` client: tiny random Qwen 3
checkpoints with Qwen 3's real chat template (``--reasoning-parser qwen3``) and DeepSeek-R1's
(``--reasoning-parser deepseek-r1``).  Random weights never close their thinking, so the thinking
budget (``thinking_token_budget``, vLLM's name) forces ``</think>``; the JSON schema or tool-call
constraint then applies to the answer only.  Streamed and whole responses agree; the thinking
switch reaches the template (``chat_template_kwargs``); /generate's ``require_reasoning`` and
``/separate_reasoning`` as SGLang has them; a model without think tokens is refused at start."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import jsonschema
import openai
import pytest

from tests.helpers.reasoning_models import openai_client, qwen3_server, DEEPSEEK_R1_TEMPLATE, build_tiny_reasoner
from tests.helpers.server_harness import ServerHandle

ANSWER = {"type": "object", "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["answer"]}
JSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER}}
TIME = {"type": "object", "properties": {"tz": {"type": "string", "enum": ["UTC", "CET", "JST"]}}, "required": ["tz"]}
TOOLS = [{"type": "function", "function": {"name": "get_time", "description": "Current time", "parameters": TIME}}]
ASK = [{"role": "user", "content": "What is six times seven?"}]


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory, smol_dir):
    yield from qwen3_server(tmp_path_factory, smol_dir, "qwen3_reasoner")


@pytest.fixture(scope="module")
def oai(qwen3):
    return openai_client(qwen3)


def reasoning(obj) -> object:
    """``reasoning_content`` of a message or a delta (an extra field to the ``openai`` types)."""
    return (obj.model_extra or {}).get("reasoning_content")


def collect(stream) -> tuple[list[str], list[str], list]:
    """(reasoning deltas, content deltas, tool-call deltas) of a streamed choice 0."""
    thoughts, contents, calls = [], [], []
    for chunk in stream:
        for ch in chunk.choices:
            r = reasoning(ch.delta)
            if r:
                assert not contents, "thinking after the answer started"
                thoughts.append(r)
            if ch.delta.content:
                contents.append(ch.delta.content)
            calls += ch.delta.tool_calls or []
    return thoughts, contents, calls


def test_json_schema_after_thinking_streamed_and_not(oai):
    kw = dict(model="m", messages=ASK, response_format=JSON_FORMAT, temperature=0, max_tokens=40,
              extra_body={"thinking_token_budget": 5}, logprobs=True)
    whole = oai.chat.completions.create(**kw)
    msg = whole.choices[0].message
    assert isinstance(reasoning(msg), str) and reasoning(msg)  # the model's 5 thinking tokens
    jsonschema.validate(json.loads(msg.content), ANSWER)  # the answer alone is constrained
    assert "</think>" not in msg.content + reasoning(msg)
    assert whole.choices[0].logprobs.content[5].token == "</think>"  # forced after 5 thinking tokens
    thoughts, contents, _ = collect(oai.chat.completions.create(**kw, stream=True))
    assert "".join(thoughts) == reasoning(msg) and "".join(contents) == msg.content


def test_thinking_off_through_chat_template_kwargs(oai):
    on = oai.chat.completions.create(model="m", messages=ASK, response_format=JSON_FORMAT, temperature=0,
                                     max_tokens=40, extra_body={"thinking_token_budget": 2})
    off = oai.chat.completions.create(model="m", messages=ASK, response_format=JSON_FORMAT, temperature=0,
                                      max_tokens=40, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    # the template closed an empty thinking block in the prompt: <think>\n\n</think>\n\n
    assert off.usage.prompt_tokens > on.usage.prompt_tokens
    assert reasoning(off.choices[0].message) is None
    jsonschema.validate(json.loads(off.choices[0].message.content), ANSWER)  # constrained from the first token
    with pytest.raises(openai.BadRequestError, match="thinking_token_budget: this request does not think"):
        oai.chat.completions.create(model="m", messages=ASK, max_tokens=4, extra_body={
            "thinking_token_budget": 2, "chat_template_kwargs": {"enable_thinking": False}})
    with pytest.raises(openai.BadRequestError, match="chat_template_kwargs.add_generation_prompt: set by the server"):
        oai.chat.completions.create(model="m", messages=ASK, max_tokens=4,
                                    extra_body={"chat_template_kwargs": {"add_generation_prompt": False}})


def test_tool_call_constraint_after_thinking(oai):
    kw = dict(model="m", messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
              temperature=0, max_tokens=60, extra_body={"thinking_token_budget": 4})
    ch = oai.chat.completions.create(**kw).choices[0]
    assert ch.finish_reason == "tool_calls" and reasoning(ch.message)
    (call,) = ch.message.tool_calls
    assert call.function.name == "get_time"
    jsonschema.validate(json.loads(call.function.arguments), TIME)
    thoughts, _, calls = collect(oai.chat.completions.create(**kw, stream=True))
    assert "".join(thoughts) == reasoning(ch.message)
    assert calls[0].function.name == "get_time"
    assert "".join(c.function.arguments or "" for c in calls) == call.function.arguments


def test_separate_reasoning_false_keeps_the_thinking_in_content(oai):
    msg = oai.chat.completions.create(model="m", messages=ASK, response_format=JSON_FORMAT, temperature=0,
                                      max_tokens=40, extra_body={"thinking_token_budget": 3,
                                                                 "separate_reasoning": False}).choices[0].message
    assert reasoning(msg) is None
    thinking, answer = msg.content.split("</think>")
    jsonschema.validate(json.loads(answer), ANSWER)


def test_generate_require_reasoning_and_separate_reasoning(qwen3):
    prompt = "<|im_start|>user\nThree digits?<|im_end|>\n<|im_start|>assistant\n"
    sp = {"regex": "[0-9]{3}", "thinking_token_budget": 4, "max_new_tokens": 20, "temperature": 0}
    with qwen3.client() as c:
        out = c.post("/generate", json={"text": prompt, "require_reasoning": True, "sampling_params": sp})
        text = out.raise_for_status().json()["text"]
        thinking, answer = text.split("</think>")
        assert re.fullmatch("[0-9]{3}", answer)
        split = c.post("/separate_reasoning", json={"text": text, "reasoning_parser": "deepseek-r1"}).json()
        assert split == {"text": answer, "reasoning_text": thinking}
        # qwen3 without a request thinks only after a leading <think> (SGLang's parser default)
        assert c.post("/separate_reasoning", json={"text": text}).json() == {"text": text, "reasoning_text": ""}
        bad = c.post("/generate", json={"text": prompt, "sampling_params": sp})
        assert bad.status_code == 400 and "thinking_token_budget: applies only to an output that thinks" in bad.text
        bad = c.post("/generate", json={"text": prompt, "require_reasoning": "yes"})
        assert bad.status_code == 400 and "require_reasoning" in bad.text
        bad = c.post("/separate_reasoning", json={"text": "x", "reasoning_parser": "nope"})
        assert bad.status_code == 400 and "unknown reasoning parser 'nope'" in bad.text


@pytest.fixture(scope="module")
def r1(tmp_path_factory, smol_dir):
    path = build_tiny_reasoner(smol_dir, str(tmp_path_factory.mktemp("r1_reasoner")), DEEPSEEK_R1_TEMPLATE)
    srv = ServerHandle(path, "--reasoning-parser", "deepseek-r1", "--max-total-tokens", "4096").wait_ready()
    yield srv
    srv.stop()


def test_deepseek_r1_template_thinks_from_the_first_token(r1):
    client = openai.OpenAI(base_url=r1.url + "/v1", api_key="none", max_retries=0, timeout=120)
    kw = dict(model="m", messages=ASK, temperature=0, max_tokens=10, logprobs=True,
              extra_body={"thinking_token_budget": 3, "chat_template_kwargs": {"enable_thinking": False}})
    ch = client.chat.completions.create(**kw).choices[0]  # R1 always thinks: the switch changes nothing
    assert [t.token for t in ch.logprobs.content][3] == "</think>"
    assert reasoning(ch.message) and "</think>" not in reasoning(ch.message)  # the answer may say anything
    thoughts, contents, _ = collect(client.chat.completions.create(**kw, stream=True))
    assert "".join(thoughts) == reasoning(ch.message) and "".join(contents) == ch.message.content


def test_a_model_without_think_tokens_is_refused_at_start(tiny_dir):
    cmd = [sys.executable, "-m", "radixserve.cli", "serve", "--model", tiny_dir, "--reasoning-parser", "qwen3",
           "--port", "1", "--log-level", "warning"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    lines = [ln for ln in (run.stdout + run.stderr).splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in run.stderr, run.stdout + run.stderr
    assert "cannot start: reasoning_parser 'qwen3': the tokenizer has no <think> token" in lines[0]
    bad = subprocess.run([sys.executable, "-m", "radixserve.cli", "serve", "--reasoning-parser", "qwen4"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "argument --reasoning-parser: invalid choice: 'qwen4'" in bad.stderr
