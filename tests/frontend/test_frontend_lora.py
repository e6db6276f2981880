"""frontend_lang with LoRA adapters on both backends (the LoRA server of tests/helpers/lora_server.py
through RuntimeEndpoint, an in-process Engine with the same adapters through EngineBackend): the
run's ``lora`` applies to every gen and select, a gen's own ``lora`` wins, and a fork's prefix hint
fills the run's adapter's cache.  References: the server's /generate with ``lora_path``."""
from __future__ import annotations

import pytest

from frontend_lang import EngineBackend, RuntimeEndpoint, function, gen, select
from tests.helpers.lora_server import MAX_RANK, USER, lora_server
from tests.helpers.models import make_engine

N = 6
GREEDY = {"max_new_tokens": N, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def lora(tiny_dir):
    return lora_server(tiny_dir)


@pytest.fixture(scope="module")
def backends(lora, tiny_dir):
    http = RuntimeEndpoint(lora.srv.url, api_key=USER)
    eng = EngineBackend(make_engine(tiny_dir, lora_paths=tuple(f"{k}={lora.adapters[k]}" for k in ("a", "b")),
                                    max_lora_rank=MAX_RANK), owns_engine=True)
    yield {"http": http, "engine": eng}
    http.shutdown()
    eng.shutdown()


def _ref(lora, text: str, name) -> str:
    with lora.client(USER) as c:
        body = {"text": text, "sampling_params": GREEDY, "lora_path": name}
        return c.post("/generate", json=body).raise_for_status().json()["text"]


@function
def story(s):
    s += "Once upon a time"
    s += gen("x", **GREEDY)  # the run's adapter
    s += gen("y", lora="b", **GREEDY)  # its own
    s += select("pick", [" red", " green", " blue"])


@pytest.mark.parametrize("kind", ["http", "engine"])
def test_run_lora_and_gen_lora(lora, backends, kind):
    state = story.run(lora="a", backend=backends[kind])
    assert state.error() is None
    assert state["x"] == _ref(lora, "Once upon a time", "a")
    assert state["y"] == _ref(lora, "Once upon a time" + state["x"], "b")
    assert state["x"] != _ref(lora, "Once upon a time", None)
    lora.idle_invariants()


def test_select_scores_under_the_run_adapter(backends):
    @function
    def pick(s):
        s += "My favourite colour is"
        s += select("c", [" red", " green", " blue"])

    def scores(kind, **kw):
        return pick.run(backend=backends[kind], **kw).get_meta_info("c")["normalized_prompt_logprobs"]

    with_a = scores("http", lora="a")
    assert with_a != pytest.approx(scores("http"), abs=1e-3)  # the adapter changes the scores
    assert with_a == pytest.approx(scores("engine", lora="a"), abs=1e-4)


@pytest.mark.parametrize("kind", ["http", "engine"])
def test_fork_prefix_hint_under_the_run_adapter(backends, kind):
    @function
    def forked(s, head):
        s += head
        forks = s.fork(2)
        forks += gen("g", max_tokens=1, temperature=0)
        return [f.get_meta_info("g")["cached_tokens"] for f in forks]

    head = f"A long shared head of text for the {kind} backend, written once and reused by both branches."
    cached = forked.run(head=head, lora="b", backend=backends[kind]).ret_value
    assert min(cached) >= 10
