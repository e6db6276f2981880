"""frontend_lang on both backends (the session's tiny-model server through RuntimeEndpoint and
an in-process tiny Engine through EngineBackend): chat roles, gen, select, fork, streaming.
The tiny random model makes text meaningless, so these tests check plumbing and exact
agreement; tests/frontend/test_frontend_smollm2.py checks real output."""
from __future__ import annotations

import json
import re

import pytest

from tests.helpers.constrained_cases import SCHEMA_TOKENS, SCHEMAS, valid
from frontend_lang import function, gen, greedy_token_selection, select
from tests.helpers.frontend_programs import chat, story

pytestmark = pytest.mark.usefixtures("kv_invariants")  # conftest.py


# ---------------------------------------------------------------------------------------- roles
@pytest.mark.parametrize("with_system", [True, False])
def test_roles_render_exactly_like_apply_chat_template(backend, tok, with_system):
    state = chat.run(question="What is a cat?", with_system=with_system, backend=backend)
    assert state.error() is None
    msgs = state.messages()
    assert [m["role"] for m in msgs] == ["system"] * with_system + ["user", "assistant", "user", "assistant"]
    assert msgs[-2]["content"] == "Now pick a colour." and msgs[-1]["content"] == state["colour"]
    assert msgs[-3]["content"] == state["answer"] and msgs[-4]["content"] == "What is a cat?"
    assert state.text() == tok.apply_chat_template(msgs, tokenize=False)
    head = msgs[:2] if with_system else msgs[:1]  # without a system turn the template adds its default one
    assert state.ret_value == tok.apply_chat_template(head, tokenize=False, add_generation_prompt=True)
    assert state.get_meta_info("answer")["prompt_tokens"] == len(tok.encode(state.ret_value))


# ---------------------------------------------------------------------------------------- gen
def test_gen_sampling_defaults_overrides_meta_and_bind(backend):
    @function
    def prog(s, topic, extra):
        s += f"Topic: {topic}. {extra}\n"
        s += gen("a")  # run-level defaults only
        s += gen("b", max_tokens=2)  # overrides max_new_tokens
        s += gen("c", stop=["\n", " "], max_tokens=8)  # a stop string never appears in the value

    state = prog.bind(extra="Go.").run(topic="tea", temperature=0, max_new_tokens=5, ignore_eos=True,
                                      backend=backend)
    assert state.error() is None
    assert state.get_meta_info("a")["completion_tokens"] == 5
    assert state.get_meta_info("b")["completion_tokens"] == 2
    assert "\n" not in state["c"] and " " not in state["c"]
    meta = state.get_meta_info("a")
    assert meta["finish_reason"]["type"] == "length" and meta["prompt_tokens"] > 0
    assert state.text() == "Topic: tea. Go.\n" + state["a"] + state["b"] + state["c"]
    assert "a" in state and "zzz" not in state
    with pytest.raises(KeyError):
        state["zzz"]


def test_gen_with_regex_and_json_schema(backend):
    person = SCHEMAS[0][1]

    @function
    def prog(s):
        s += "Date: " + gen("date", regex=r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-[0-3][0-9]", max_tokens=32, temperature=1)
        s += "\nPerson: " + gen("person", json_schema=person, max_tokens=2 * SCHEMA_TOKENS, temperature=1, seed=3)
        s += "\nColour: " + gen("colour", choices=["red", "green"])  # a select, as in SGLang

    state = prog.run(backend=backend)
    assert state.error() is None
    assert re.fullmatch(r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-[0-3][0-9]", state["date"]), state["date"]
    assert valid("json", person, state["person"]), state["person"]
    assert isinstance(json.loads(state["person"]), dict)
    assert state["colour"] in ("red", "green")


# ---------------------------------------------------------------------------------------- select
def _direct_choice_logprobs(server, tok, prefix, choice):
    """Logprobs of the choice's tokens computed over the whole prompt in one /generate call."""
    p_ids, ids = tok.encode(prefix), tok.encode(prefix + choice)
    start = next((i for i, (a, b) in enumerate(zip(p_ids, ids)) if a != b), min(len(p_ids), len(ids) - 1))
    with server.client() as c:
        r = c.post("/generate", json={"input_ids": ids, "sampling_params": {"max_new_tokens": 0},
                                      "return_logprob": True, "logprob_start_len": 0})
    assert r.status_code == 200, r.text
    entries = r.json()["meta_info"]["input_token_logprobs"]
    assert [e[1] for e in entries] == ids
    return [e[0] for e in entries[start:] if e[0] is not None]


@pytest.mark.parametrize("prefix", ["The best answer is", "The best answer is ", "Answer:\n"])
def test_select_agrees_with_direct_logprobs(http_backend, server, tok, prefix):
    choices = ["yes", " no", "maybe later", "42"]

    @function
    def prog(s):
        s += prefix + select("x", choices)
        s += "|" + select("g", choices, choices_method=greedy_token_selection)

    state = prog.run(backend=http_backend)
    assert state.error() is None
    meta = state.get_meta_info("x")
    direct = [_direct_choice_logprobs(server, tok, prefix, c) for c in choices]
    want = [sum(d) / len(d) for d in direct]
    assert meta["normalized_prompt_logprobs"] == pytest.approx(want, abs=2e-3)
    assert meta["sum_prompt_logprobs"] == pytest.approx([sum(d) for d in direct], abs=5e-3)
    assert [[lp for lp, _ in t] for t in meta["input_token_logprobs"]] == [pytest.approx(d, abs=2e-3) for d in direct]
    assert state["x"] == choices[max(range(len(choices)), key=lambda i: want[i])] == meta["decision"]
    # only the junction is scored: logprobs start within a token of the prefix's end
    assert meta["prefix_tokens"] - 1 <= meta["logprob_start_len"] <= meta["prefix_tokens"]
    assert state.text() == prefix + state["x"] + "|" + state["g"]
    g = state.get_meta_info("g")
    assert g["method"] == "greedy_token_selection" and state["g"] in choices


def test_select_methods_on_both_backends_agree(http_backend, engine_backend):
    @function
    def prog(s):
        s += "Q: pick one.\nA:" + select("a", ["cat", "dog", "bird"])
        s += "\nB:" + select("b", ["cat", "dog", "bird"], choices_method="unconditional_likelihood_normalized")

    a, b = prog.run(backend=http_backend), prog.run(backend=engine_backend)
    for name in ("a", "b"):
        ma, mb = a.get_meta_info(name), b.get_meta_info(name)
        assert a[name] == b[name] and ma["decision_index"] == mb["decision_index"]
        assert ma["scores"] == pytest.approx(mb["scores"], abs=2e-3)
    assert a.get_meta_info("b")["unconditional_token_logprobs"] is not None


# ---------------------------------------------------------------------------------------- fork
def test_fork_and_join(backend, tok):
    @function
    def prog(s):
        s += "A list of three ideas about tea.\n"
        forks = s.fork(3)
        for i, f in enumerate(forks):
            f += f"Idea {i + 1}:" + gen("idea", max_tokens=4, temperature=0, ignore_eos=True)
        forks += ["\nx", "\ny", "\nz"]
        forks += gen("tail", max_tokens=2, temperature=0)
        ideas = [f["idea"] for f in forks]
        forks.join()
        s += "Summary:" + gen("summary", max_tokens=3, temperature=0)
        return ideas, [f.text() for f in forks]

    state = prog.run(backend=backend)
    ideas, branch_texts = state.ret_value
    assert state.error() is None
    assert state["idea"] == ideas and len(ideas) == 3 and len(state["tail"]) == 3
    parent_prefix = "A list of three ideas about tea.\n"
    for i, (text, idea) in enumerate(zip(branch_texts, ideas)):
        assert text == f"{parent_prefix}Idea {i + 1}:{idea}\n{'xyz'[i]}{state['tail'][i]}"
    assert state.text() == parent_prefix + "Summary:" + state["summary"]  # branches do not touch the parent
    # the fork sent the shared prefix once, so every branch found it cached
    assert all(m["cached_tokens"] >= len(tok.encode(parent_prefix)) - 1 for m in state.get_meta_info("idea"))


# ---------------------------------------------------------------------------------------- streaming
def test_streaming_text_iter(backend):
    state = story.run(backend=backend, stream=True)
    chunks = list(state.text_iter("story"))
    assert chunks and all(chunks)
    assert "".join(chunks) == state["story"] and state.get_meta_info("story")["completion_tokens"] == 24
    assert "".join(state.text_iter("after")) == state["after"]
    assert list(state.text_iter("never_generated")) == []  # ends, never hangs

    whole = story.run(backend=backend, stream=True)
    assert "".join(whole.text_iter()) == whole.text()
    non_stream = story.run(backend=backend)
    assert non_stream.text() == whole.text() == state.text()  # greedy: same text either way
