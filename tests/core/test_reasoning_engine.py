"""Reasoning models in the scheduler, on a tiny random Qwen 3 (``--reasoning-parser qwen3``): a
constraint applies to the answer after ``</think>`` only, the thinking is sampled as if
unconstrained (no mask, no jump-forward), the thinking budget forces ``</think>``, and a model
whose tokenizer lacks the think tags is refused."""
from __future__ import annotations

import json
import re

import jsonschema
import pytest

from tests.helpers.models import make_engine
from tests.helpers.reasoning_models import build_tiny_reasoner

PROMPT = "<|im_start|>user\nWhat is six times seven?<|im_end|>\n<|im_start|>assistant\n"
# a long forced key: jump-forward has text to skip once the answer starts
SCHEMA = {"type": "object", "properties": {"the_answer_to_the_question": {"type": "integer", "minimum": 0,
                                                                          "maximum": 99}},
          "required": ["the_answer_to_the_question"]}


@pytest.fixture(scope="module")
def eng(tmp_path_factory, smol_dir):
    e = make_engine(build_tiny_reasoner(smol_dir, str(tmp_path_factory.mktemp("qwen3_reasoner"))),
                    reasoning_parser="qwen3", max_total_tokens=4096)
    yield e
    e.shutdown()


@pytest.fixture(scope="module")
def end_id(eng) -> int:
    return eng.tokenizer.convert_tokens_to_ids("</think>")


@pytest.fixture(scope="module")
def free(eng, end_id) -> list[int]:
    """The greedy unconstrained output: the thinking a deferred grammar must leave alone."""
    ids = eng.generate(PROMPT, {"max_new_tokens": 8, "temperature": 0})["output_ids"]
    assert end_id not in ids  # random weights never close the thinking by themselves
    return ids


def test_json_schema_applies_after_the_thinking_only(eng, end_id, free):
    jumps = eng.run_on_driver(lambda s: s.grammars.num_jumps, 30)
    out = eng.generate(PROMPT, {"max_new_tokens": 40, "temperature": 0, "require_reasoning": True,
                                "thinking_token_budget": 6, "json_schema": SCHEMA})
    ids = out["output_ids"]
    assert ids[:6] == free[:6]  # sampled as without a grammar: nothing masked, nothing jumped
    assert ids[6] == end_id  # the budget closed the thinking
    reasoning, answer = out["text"].split("</think>", 1)
    assert reasoning == eng.tokenizer.decode(free[:6])
    jsonschema.validate(json.loads(answer), SCHEMA)
    assert out["meta_info"]["finish_reason"]["type"] == "stop"
    assert eng.run_on_driver(lambda s: s.grammars.num_jumps, 30) > jumps  # the answer's key was jumped


def test_without_require_reasoning_the_constraint_starts_at_once(eng):
    out = eng.generate(PROMPT, {"max_new_tokens": 40, "temperature": 0, "json_schema": SCHEMA})
    jsonschema.validate(json.loads(out["text"]), SCHEMA)


def test_regex_and_budget_alone(eng, end_id, free):
    out = eng.generate(PROMPT, {"max_new_tokens": 20, "temperature": 0, "require_reasoning": True,
                                "thinking_token_budget": 3, "regex": "[0-9]{3}"})
    assert out["output_ids"][:4] == free[:3] + [end_id]
    assert re.fullmatch("[0-9]{3}", out["text"].split("</think>", 1)[1])
    # a budget without a constraint: </think> forced, then the model's own answer
    out = eng.generate(PROMPT, {"max_new_tokens": 6, "temperature": 0, "require_reasoning": True,
                                "thinking_token_budget": 2})
    assert out["output_ids"][:3] == free[:2] + [end_id]
    zero = eng.generate(PROMPT, {"max_new_tokens": 3, "temperature": 0, "require_reasoning": True,
                                 "thinking_token_budget": 0})
    assert zero["output_ids"][0] == end_id and zero["text"].startswith("</think>")


def test_a_model_without_think_tokens_is_refused(tiny_dir):
    with pytest.raises(ValueError, match=r"reasoning_parser 'deepseek-r1': the tokenizer has no <think> token"):
        make_engine(tiny_dir, reasoning_parser="deepseek-r1", max_total_tokens=512)
    with pytest.raises(ValueError, match="reasoning_parser: must be one of none, qwen3"):
        make_engine(tiny_dir, reasoning_parser="qwen4")
