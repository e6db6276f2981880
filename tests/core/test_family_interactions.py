"""The serving features on a non-Llama family: tiny random Qwen 3 (q/k norms, head_dim !=
hidden / heads; tests/helpers/families.py) with SmolLM2's tokenizer and Qwen 2.5's chat template.

- structured output through the Engine: a JSON-schema and a regex constraint, greedy and
  sampled, give complete valid output (test_constrained.py's checks);
- tool calling through the OpenAI chat route: the template renders the tools itself (the
  prompt is its rendering, token for token), ``tool_choice`` "required" and a named function
  give parsed calls that validate against the function's schema, and a ``role: tool`` result
  goes back through the template;
- embeddings: ``Engine.encode`` equals transformers' final hidden state (after the last norm)
  pooled by the last token or the mean and L2-normalized, within 1e-4, cold and from the cache.
"""
from __future__ import annotations

import json

import jsonschema
import numpy as np
import openai
import pytest
import torch

from tests.helpers.constrained_cases import SCHEMA_TOKENS, SCHEMAS, valid
from tests.helpers.families import WINDOW, build_family
from tests.helpers.models import make_engine
from tests.helpers.qwen_template import set_qwen_template
from tests.helpers.server_harness import ServerHandle

ATOL = 1e-4
REGEX = r"((25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])\.){3}[0-9]{1,3}"
SCHEMA = SCHEMAS[16][1]  # nested object, a string pattern, required keys
FORECAST = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]},
                                             "days": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["city", "days"]}
TIME = {"type": "object", "properties": {"tz": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["tz"]}
TOOLS = [{"type": "function", "function": {"name": "get_forecast", "description": "Weather forecast",
                                           "parameters": FORECAST}},
         {"type": "function", "function": {"name": "get_time", "description": "Current time", "parameters": TIME}}]
SCHEMAS_BY_NAME = {"get_forecast": FORECAST, "get_time": TIME}
ASK = [{"role": "user", "content": "What will the weather be in Paris for the next 3 days?"}]


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory, smol_dir):
    """(path, transformers model) of the tiny Qwen 3 with Qwen 2.5's chat template."""
    path = str(tmp_path_factory.mktemp("qwen3"))
    hf = build_family("qwen3", path, smol_dir)
    set_qwen_template(path)
    return path, hf


@pytest.fixture(scope="module")
def eng(qwen3):
    with make_engine(qwen3[0], max_total_tokens=2048, chunked_prefill_size=16) as e:
        yield e


# ---------------------------------------------------------------- structured output
@pytest.mark.parametrize("kind,spec", [("regex", REGEX), ("json_schema", SCHEMA)], ids=["regex", "json_schema"])
def test_constrained_output_is_valid(eng, kind, spec):
    prompts = ["Server IP address:", "A person with an address as JSON:", "the the list date"]
    params = [{kind: spec, "max_new_tokens": 2 * SCHEMA_TOKENS, "temperature": t, "seed": i}
              for i, t in enumerate((0.0, 1.0, 1.0))]
    outs = eng.generate(prompts, params)
    for o in outs:
        assert o["meta_info"]["finish_reason"]["type"] == "stop", o
        assert valid("json" if kind == "json_schema" else kind, spec, o["text"]), o["text"]
    eng.check_invariants()


# ---------------------------------------------------------------- tool calling
@pytest.fixture(scope="module")
def oai(qwen3):
    srv = ServerHandle(qwen3[0], "--max-total-tokens", "2048").wait_ready()
    yield openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120)
    srv.stop()


def _calls(choice, n: int) -> list:
    """The choice's ``n`` parsed calls, each validated against its function's schema."""
    calls = choice.message.tool_calls
    assert choice.finish_reason == "tool_calls" and calls and len(calls) == n, choice
    for c in calls:
        assert c.id.startswith("call_") and c.type == "function"
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS_BY_NAME[c.function.name])
    return calls


def _template_tokens(qwen3, messages: list[dict]) -> int:
    """Prompt length under the model's own (Qwen) template, tools rendered by it."""
    from transformers import AutoTokenizer

    from radixserve.tools.prompt import hf_messages

    tok = AutoTokenizer.from_pretrained(qwen3[0])
    text = tok.apply_chat_template(hf_messages(messages), tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert "<tools>" in text and "get_forecast" in text
    return len(tok.encode(text, add_special_tokens=False))


def test_required_and_named_tool_calls_through_the_qwen_template(oai, qwen3):
    kw = dict(model="m", messages=ASK, tools=TOOLS, temperature=0, max_tokens=60)
    required = oai.chat.completions.create(**kw, tool_choice="required", parallel_tool_calls=False)
    [call] = _calls(required.choices[0], 1)
    assert required.choices[0].message.content is None
    assert required.usage.prompt_tokens == _template_tokens(qwen3, ASK)
    sampled = oai.chat.completions.create(**{**kw, "temperature": 1.0}, tool_choice="required", n=3, seed=5)
    for ch in sampled.choices:  # parallel calls allowed: one or more each
        _calls(ch, len(ch.message.tool_calls or [None]))
    named = oai.chat.completions.create(**kw, tool_choice={"type": "function", "function": {"name": "get_time"}})
    [got] = _calls(named.choices[0], 1)
    assert got.function.name == "get_time"
    # the call and its result back through the template
    convo = [*ASK, required.choices[0].message.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"forecast": "sunny"})}]
    second = oai.chat.completions.create(model="m", messages=convo, tools=TOOLS, temperature=0, max_tokens=4)
    assert second.usage.prompt_tokens == _template_tokens(qwen3, convo)


# ---------------------------------------------------------------- embeddings
def _hf_embedding(hf, ids: list[int], pooling: str) -> np.ndarray:
    """transformers' last hidden state (after the final norm), pooled, L2-normalized."""
    with torch.no_grad():
        h = hf.model(torch.tensor([ids])).last_hidden_state[0]
    v = h[-1] if pooling == "last" else h.mean(0)
    return torch.nn.functional.normalize(v, dim=0).numpy()


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_embeddings_match_transformers(eng, qwen3, pooling):
    hf = qwen3[1]
    ids = [list(range(300, 305)), list(range(400, 400 + 3 * WINDOW + 5)), list(range(400, 400 + 2 * WINDOW))]
    want = [_hf_embedding(hf, i, pooling) for i in ids]
    eng.flush_cache()
    for _ in range(2):  # cold, then from the radix cache ("last" reuses the prefix)
        got = eng.encode(input_ids=ids, pooling=pooling)
        for g, w in zip(got, want, strict=True):
            assert np.abs(np.asarray(g["embedding"]) - w).max() < ATOL
    if pooling == "last":
        assert [o["meta_info"]["cached_tokens"] for o in got] == [len(i) - 1 for i in ids]
    eng.check_invariants()
