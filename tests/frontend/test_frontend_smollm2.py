"""frontend_lang with the real SmolLM2 (``slow``): answers that make sense, and the same
greedy transcript from the HTTP server and from the in-process engine (both fp32)."""
from __future__ import annotations

import re

import pytest

from frontend_lang import Runtime, RuntimeEndpoint, assistant, function, gen, select, system, user

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def backends(smol_server, smol_dir):
    http, local = RuntimeEndpoint(smol_server.url), Runtime(smol_dir, dtype="float32", max_total_tokens=4096)
    yield {"http": http, "engine": local}
    http.shutdown()
    local.shutdown()


@function
def quiz(s):
    s += system("You are a helpful assistant. Answer briefly.")
    s += user("What is the capital of France?")
    s += assistant(gen("capital", max_tokens=16))
    s += user("Which animal says meow?")
    s += assistant("The animal is a " + select("animal", ["dog", "cat", "cow"]))
    s += user("In which year did World War II end? Reply with the year only.")
    s += assistant(gen("year", regex="(19|20)[0-9]{2}", max_tokens=8))
    forks = s.fork(2)
    forks += [user("Name a colour."), user("Name a fruit.")]
    forks += assistant(gen("item", max_tokens=8))
    forks.join()


def test_quiz_answers_and_backend_parity(backends):
    states = {name: quiz.run(backend=be, temperature=0) for name, be in backends.items()}
    for st in states.values():
        assert st.error() is None
        assert "Paris" in st["capital"]
        assert st["animal"] == "cat"
        meta = st.get_meta_info("animal")
        assert meta["scores"][1] == max(meta["scores"])
        assert re.fullmatch("(19|20)[0-9]{2}", st["year"])
        assert len(st["item"]) == 2 and len(st.messages()) == 7
    http, local = states["http"], states["engine"]
    assert http.text() == local.text()
    assert http["item"] == local["item"]
    assert http.get_meta_info("animal")["scores"] == pytest.approx(local.get_meta_info("animal")["scores"], abs=1e-3)


def test_streaming_matches_the_final_text(backends):
    @function
    def story(s):
        s += user("Write two sentences about the sea.")
        s += assistant(gen("story", max_tokens=40, temperature=0, stop=". "))

    texts = []
    for be in backends.values():
        state = story.run(backend=be, stream=True)
        chunks = list(state.text_iter("story"))
        assert "".join(chunks) == state["story"] and state["story"]  # the stop string never streams
        assert state.get_meta_info("story")["finish_reason"] == {"type": "stop", "matched": ". "}
        assert state.text().endswith(state["story"] + "<|im_end|>\n")
        texts.append(state.text())
    assert texts[0] == texts[1]
