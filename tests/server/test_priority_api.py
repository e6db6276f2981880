"""The ``priority`` field on every front end: /generate (top level, SGLang's place, or in
``sampling_params``), the OpenAI routes (an extra body field: ``extra_body`` of the official
client), ``Engine`` and ``frontend_lang``'s ``gen``/``select`` (and a run's default).  A
non-integer priority is a 4xx (a ValueError in process) naming the field."""
from __future__ import annotations

import openai
import pytest

from tests.helpers.models import make_engine
from frontend_lang import EngineBackend, function, gen, select
from tests.helpers.server_harness import API_KEY, shared_server

HI = {"text": "hi", "sampling_params": {"max_new_tokens": 1}}
MSGS = [{"role": "user", "content": "hi"}]
BAD = [
    ("/generate", {**HI, "priority": "high"}),
    ("/generate", {**HI, "priority": 1.5}),
    ("/generate", {**HI, "priority": True}),
    ("/generate", {"text": "hi", "sampling_params": {"priority": "5"}}),
    ("/generate", {"text": "hi", "priority": 1, "sampling_params": {"priority": 2}}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 1, "priority": 2.5}),
    ("/v1/chat/completions", {"messages": MSGS, "max_tokens": 1, "priority": "urgent"}),
]


@pytest.fixture(scope="module")
def server(tiny_dir):
    return shared_server(tiny_dir)


@pytest.mark.parametrize("route,body", BAD)
def test_non_integer_priority_is_a_400_naming_it(server, route, body):
    with server.client() as http:
        r = http.post(route, json=body)
    assert r.status_code == 400, r.text
    assert "priority" in r.text


def test_priority_is_accepted_everywhere_on_the_server(server):
    with server.client() as http:
        for body in ({**HI, "priority": 7}, {"text": "hi", "sampling_params": {"max_new_tokens": 1, "priority": -3}},
                     {**HI, "priority": 2, "sampling_params": {"max_new_tokens": 1, "priority": 2}}):
            r = http.post("/generate", json=body)
            assert r.status_code == 200, r.text
    oai = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)
    c = oai.chat.completions.create(model="m", messages=MSGS, max_tokens=2, extra_body={"priority": 5})
    assert c.choices[0].finish_reason in ("length", "stop")
    oai.completions.create(model="m", prompt="hi", max_tokens=1, extra_body={"priority": 1})
    with pytest.raises(openai.BadRequestError, match="priority"):
        oai.chat.completions.create(model="m", messages=MSGS, max_tokens=2, extra_body={"priority": "x"})


@function
def prog(s):
    s += "Question: is the sky blue? Answer:" + gen("a", max_tokens=2, temperature=0, priority=4)
    s += " So:" + select("b", ["yes", "no"], priority=6)
    s += " Again:" + select("c", ["yes", "no"])


def test_engine_and_frontend_carry_the_priority(tiny_dir):
    eng = make_engine(tiny_dir)
    seen: list[int] = []
    eng.run_on_driver(lambda s: s.hooks.append(lambda r: seen.append(r.sampling.priority)))
    with pytest.raises(ValueError, match="priority"):
        eng.generate("hi", {"priority": "high"})
    eng.generate("hi", {"max_new_tokens": 1, "priority": 3})
    assert seen == [3]
    seen.clear()
    be = EngineBackend(eng)
    prog.run(backend=be, priority=2)
    # gen: its own 4; first select: 6 on its prefix hint and every choice; second: the run's 2
    assert seen[0] == 4 and set(seen[1:4]) == {6} and set(seen[4:]) == {2}, seen
    be.shutdown()
    eng.shutdown()
