"""frontend_lang errors (server messages on read, a dead backend never hangs), run_batch's
shared-prefix hint, the same greedy text on both backends, and the server routes the
frontend needs (/tokenize, the chat template in /get_model_info)."""
from __future__ import annotations

import re
import threading

import httpx
import pytest

from frontend_lang import (BackendError, ProgramError, RuntimeEndpoint, assistant, function, gen, get_default_backend,
                           select, set_default_backend, system, user)
from tests.helpers.frontend_programs import SYS, chat, story
from tests.helpers.server_harness import free_port

pytestmark = pytest.mark.usefixtures("kv_invariants")  # conftest.py


# ---------------------------------------------------------------------------------------- errors
def test_invalid_regex_raises_the_servers_message_on_read(backend):
    @function
    def prog(s):
        s += "x" + gen("ok", max_tokens=2)
        s += gen("bad", regex="(a")
        s += gen("later", max_tokens=2)

    state = prog.run(backend=backend)  # run() returns; the failure is stored
    assert isinstance(state.error(), BackendError) and state.error().status == 400
    needle = "sampling_params.regex: invalid regular expression: missing ), unterminated subpattern"
    with pytest.raises(BackendError, match=re.escape(needle)):
        state["bad"]
    with pytest.raises(BackendError, match=re.escape(needle)):
        state["later"]  # dropped after the failure: raises too, does not hang
    assert isinstance(state["ok"], str)  # set before the failure

    @function
    def bad_temp(s):
        s += "x" + gen("t", temperature=-1.0)

    with pytest.raises(BackendError, match="sampling_params.temperature"):
        bad_temp.run(backend=backend)["t"]


def test_program_errors(http_backend):
    @function
    def wrong_role(s):
        s += "text"
        with s.user():
            s += assistant("nested")

    with pytest.raises(ProgramError, match="begun inside role"):
        wrong_role.run(backend=http_backend)["x"]
    @function
    def select_first(s):
        s += select("x", ["a", "b"])

    with pytest.raises(ProgramError, match="no text before the choices"):
        select_first.run(backend=http_backend)["x"]
    old = get_default_backend()
    set_default_backend(None)
    try:
        with pytest.raises(ProgramError, match="no backend"):
            wrong_role.run()
    finally:
        set_default_backend(old)


@pytest.mark.timeout(120)
def test_dead_backend_raises_without_hanging():
    dead = RuntimeEndpoint(f"http://127.0.0.1:{free_port()}", connect_timeout=2, timeout=10)
    outcome = {}

    def body():
        try:
            outcome["chat"] = chat.run(question="hi", backend=dead)
            outcome["batch"] = story.run_batch([{}, {}, {}], backend=dead)
            with pytest.raises(BackendError, match="cannot reach the server"):
                outcome["chat"]["answer"]
            for st in outcome["batch"]:
                with pytest.raises(BackendError, match="cannot reach the server"):
                    st["story"]
            outcome["ok"] = True
        except BaseException as e:  # noqa: BLE001 - reported below
            outcome["error"] = e

    t = threading.Thread(target=body, daemon=True)
    t.start()
    t.join(90)
    assert not t.is_alive(), "a read on a dead backend hung"
    assert outcome.get("ok"), outcome.get("error")
    dead.shutdown()


# ---------------------------------------------------------------------------------------- batch
def test_run_batch_shares_the_system_prompt(backend, tok):
    @function
    def qa(s, i):
        s += system(SYS)
        s += user(f"Question number {i}: what is {i} plus {i}?")
        s += assistant(gen("answer", max_tokens=3))

    n = 64
    states = qa.run_batch([{"i": i} for i in range(n)], temperature=0, backend=backend, num_threads=16,
                          progress_bar=True)
    sys_len = len(tok.encode(tok.apply_chat_template([{"role": "system", "content": SYS}], tokenize=False)))
    cached = [st.get_meta_info("answer")["cached_tokens"] for st in states]
    # run_batch sent the shared prefix first, so even the first program finds it cached
    assert all(c >= sys_len for c in cached), (sys_len, cached)
    assert [st.messages()[1]["content"] for st in states] == [f"Question number {i}: what is {i} plus {i}?"
                                                             for i in range(n)]
    assert all(st.error() is None for st in states)


def test_default_backend_and_nested_programs(http_backend):
    @function
    def inner(s, word):
        s += f"[{word}]"

    @function()
    def outer(s):
        inner(s, "a")
        inner(s, word="b")
        s += gen("x", max_tokens=2, temperature=0)

    old = get_default_backend()
    set_default_backend(http_backend)
    try:
        state = outer.run()
        assert state.text() == "[a][b]" + state["x"]
        assert [st.text().startswith("[a][b]") for st in outer.run_batch([{}, {}], num_threads="auto")] == [True] * 2
    finally:
        set_default_backend(old)


# ---------------------------------------------------------------------------------------- parity
def test_same_program_same_greedy_text_on_both_backends(http_backend, engine_backend):
    @function
    def prog(s, q):
        s += system(SYS)
        s += user(q)
        s += assistant(gen("a", max_tokens=12))
        s += user("Pick one.")
        s += assistant(select("c", ["alpha", "beta", "gamma delta"]))
        forks = s.fork(2)
        forks += [gen("f", max_tokens=5), "Other:" + gen("f", max_tokens=5)]
        forks.join()
        s += gen("z", max_tokens=8, regex="[a-z]{2,6}")

    kwargs = [{"q": "Name a fruit."}, {"q": "Count to three, please, slowly."}]
    for backend_states in zip(prog.run_batch(kwargs, temperature=0, backend=http_backend),
                              prog.run_batch(kwargs, temperature=0, backend=engine_backend)):
        a, b = backend_states
        assert a.error() is None and b.error() is None
        assert a.text() == b.text()
        assert (a["a"], a["c"], a["f"], a["z"]) == (b["a"], b["c"], b["f"], b["z"])


# ---------------------------------------------------------------------------------------- server additions
def test_tokenize_and_chat_template_endpoints(server, tok):
    with server.client() as c:
        one = c.post("/tokenize", json={"text": "Hello world"}).json()["input_ids"]
        many = c.post("/tokenize", json={"text": ["Hello world", "a b"]}).json()["input_ids"]
        bad = c.post("/tokenize", json={"text": 3})
        info = c.get("/get_model_info").json()
    assert one == tok.encode("Hello world") and many == [one, tok.encode("a b")]
    assert bad.status_code == 400 and "text" in bad.json()["error"]["message"]
    assert info["chat_template"] == tok.chat_template and info["special_tokens_map"]["eos_token"] == tok.eos_token
    assert httpx.post(server.url + "/tokenize", json={"text": "x"}).status_code == 401  # API key applies
