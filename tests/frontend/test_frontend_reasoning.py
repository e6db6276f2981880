"""``separate_reasoning`` in frontend_lang as in SGLang's frontend: ``s += separate_reasoning(gen("x"),
model_type=...)`` leaves the answer in ``s["x"]`` and the thinking in ``s["x_reasoning_content"]``,
on an in-process tiny Qwen 3 with DeepSeek-R1's chat template (``--reasoning-parser deepseek-r1``);
the thinking budget closes the random model's thinking."""
from __future__ import annotations

import re

import pytest

from frontend_lang import EngineBackend, ProgramError, assistant, function, gen, select, separate_reasoning, user
from tests.helpers.models import make_engine
from tests.helpers.reasoning_models import DEEPSEEK_R1_TEMPLATE, build_tiny_reasoner

THINK = dict(require_reasoning=True, thinking_token_budget=3, temperature=0)


@pytest.fixture(scope="module")
def r1(tmp_path_factory, smol_dir):
    path = build_tiny_reasoner(smol_dir, str(tmp_path_factory.mktemp("r1_frontend")), DEEPSEEK_R1_TEMPLATE)
    be = EngineBackend(make_engine(path, reasoning_parser="deepseek-r1", max_total_tokens=2048))
    yield be
    be.shutdown()


def test_answer_and_thinking_in_two_variables(r1):
    @function
    def prog(s):
        s += user("Three digits, please.")
        s += assistant(separate_reasoning(gen("x", max_tokens=12, regex="[0-9]{3}", **THINK),
                                          model_type="deepseek-r1"))
        s += user("And again?")
        s += assistant(gen("y", max_tokens=12, regex="[0-9]{3}", **THINK))

    state = prog.run(backend=r1)
    assert state.error() is None, state.error()
    assert re.fullmatch("[0-9]{3}", state["x"])  # the answer alone: the regex applied after </think>
    thinking = state["x_reasoning_content"]
    assert thinking and "</think>" not in thinking
    assert thinking + "</think>" + state["x"] in state.text()  # the transcript keeps the whole output
    assert "</think>" in state["y"]  # not separated


def test_model_types_and_edge_cases(r1):
    @function
    def prog(s):
        s += "Q: pick.\nA:"
        s += separate_reasoning(gen("x", max_tokens=8, **THINK), model_type="qwen3")
        s += separate_reasoning(select("c", ["yes", "no"]), model_type="deepseek-r1")

    state = prog.run(backend=r1)
    assert state.error() is None, state.error()
    # qwen3's parser thinks only after a leading <think>: the whole output is the answer
    assert "</think>" in state["x"] and state["x_reasoning_content"] == ""
    # deepseek-r1's always starts thinking: a choice without </think> is all reasoning
    assert state["c"] == "" and state["c_reasoning_content"] in ("yes", "no")
    with pytest.raises(ProgramError, match="model_type is required"):
        separate_reasoning(gen("x"))
    with pytest.raises(ProgramError, match="unknown reasoning parser 'qwen9'"):
        separate_reasoning(gen("x"), model_type="qwen9")
