"""/v1/responses on a reasoning model (tiny random Qwen 3 with Qwen 3's real chat template,
``--reasoning-parser qwen3``), through the official ``openai`` client: the thinking is a ``reasoning``
output item before the answer, streamed as ``response.reasoning_text.*`` events; the JSON schema
applies to the answer only; ``reasoning.effort: "none"`` turns thinking off.  Random weights never
close their thinking, so ``thinking_token_budget`` (an extension field) forces ``</think>``."""
from __future__ import annotations

import json

import jsonschema
import pytest

from tests.helpers.reasoning_models import openai_client, qwen3_server

ANSWER = {"type": "object", "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["answer"]}
TEXT = {"format": {"type": "json_schema", "name": "answer", "schema": ANSWER}}


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory, smol_dir):
    yield from qwen3_server(tmp_path_factory, smol_dir, "qwen3_responses")


@pytest.fixture(scope="module")
def oai(qwen3):
    return openai_client(qwen3)


def test_reasoning_item_before_the_answer_streamed_and_not(oai):
    kw = dict(model="m", input="What is six times seven?", text=TEXT, temperature=0, max_output_tokens=40,
              extra_body={"thinking_token_budget": 5})
    r = oai.responses.create(**kw)
    assert [o.type for o in r.output] == ["reasoning", "message"] and r.status == "completed"
    thought = r.output[0].content[0].text
    assert thought and "</think>" not in thought + r.output_text
    jsonschema.validate(json.loads(r.output_text), ANSWER)  # the answer alone is constrained
    assert r.usage.output_tokens_details.reasoning_tokens == 6  # 5 thinking tokens and the forced </think>
    assert r.usage.output_tokens > 6
    with oai.responses.stream(**kw) as s:
        events = list(s)
        final = s.get_final_response()
    kinds = [e.type for e in events]
    assert kinds.index("response.reasoning_text.done") < kinds.index("response.output_text.delta")
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == thought
    assert final.output_text == r.output_text and final.output[0].content[0].text == thought
    assert final.usage.output_tokens_details.reasoning_tokens == 6


def test_effort_none_turns_thinking_off(oai):
    r = oai.responses.create(model="m", input="What is six times seven?", text=TEXT, temperature=0,
                             max_output_tokens=40, reasoning={"effort": "none"})
    assert [o.type for o in r.output] == ["message"] and r.usage.output_tokens_details.reasoning_tokens == 0
    jsonschema.validate(json.loads(r.output_text), ANSWER)  # constrained from the first token
