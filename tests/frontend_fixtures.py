"""Shared fixtures and programs of the tests/test_frontend_*.py modules: the session's tiny
server behind a RuntimeEndpoint, an in-process tiny Engine behind an EngineBackend, and
``backend``, which runs a test once on each."""
from __future__ import annotations

import time

import pytest

from conftest import make_engine
from frontend_lang import EngineBackend, RuntimeEndpoint, assistant, function, gen, select, system, user
import server_harness
from server_harness import API_KEY, ServerHandle, shared_server

SYS = ("You are a careful assistant. Answer every question in one short sentence, cite no sources, "
       "and never apologise. Prefer plain words over jargon.")


@pytest.fixture(scope="module")
def server(tiny_dir):
    return shared_server(tiny_dir)


@pytest.fixture(scope="module")
def http_backend(server):
    be = RuntimeEndpoint(server.url, api_key=API_KEY)
    yield be
    be.shutdown()


@pytest.fixture(scope="module")
def engine_backend(tiny_dir):
    be = EngineBackend(make_engine(tiny_dir))
    yield be
    be.shutdown()


def _engine_idle_invariants(sched) -> None:
    assert not sched.has_work(), sched.stats()
    sched.check_invariants()


@pytest.fixture(autouse=True)
def kv_invariants(request):
    """After every test: no request holds a KV slot and the allocator's invariants hold, on
    the shared server and on the in-process engine (checked on its driver thread) -- for
    whichever of the two the test used, directly or through ``backend``."""
    yield
    used = list(request.node.funcargs.values())
    if any(isinstance(v, (RuntimeEndpoint, ServerHandle)) for v in used):
        s = server_harness._shared.wait_idle()["scheduler"]
        assert s["invariants_ok"], s["invariant_error"]
        assert s["held_slots"] == 0, s
    for be in (v for v in used if isinstance(v, EngineBackend)):
        deadline = time.time() + 30
        while be.engine.run_on_driver(lambda s: s.has_work(), 30) and time.time() < deadline:
            time.sleep(0.1)
        be.engine.run_on_driver(_engine_idle_invariants, 30)


@pytest.fixture(params=["http", "engine"])
def backend(request):
    return request.getfixturevalue(f"{request.param}_backend")


@pytest.fixture(scope="module")
def tok(tiny_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)


@function
def chat(s, question, with_system=True):
    if with_system:
        s += system(SYS)
    s += user(question)
    with s.assistant():
        before = s.text()  # the prompt the gen sees
        s += gen("answer", max_tokens=6, temperature=0)
    with s.user():
        s += "Now pick "
        s += "a colour."
    s += assistant(select("colour", ["red", "green", "dark blue"]))
    return before


@function
def story(s):
    s += user("Tell me a story.")
    s += assistant(gen("story", max_tokens=24, temperature=0, ignore_eos=True))
    s += "After." + gen("after", max_tokens=4, temperature=0)
