"""SGLang compatibility, tested with SGLang's own code.

* The native API takes SGLang's /generate fields: an unknown name (top level or in
  sampling_params) is a 400 naming it, a field we cannot honour is a 400 naming it when set,
  ``stop_regex`` / ``no_stop_trim`` work streamed and not (tiny model, fast).
* SGLang's own frontend test programs (``sglang.test.test_programs`` of sglang==0.5.10.post1,
  installed by ``make install`` with --no-deps) run against the SmolLM2 server (``slow``):
  (1) through SGLang's client (``sgl.RuntimeEndpoint``), and (2) through ``frontend_lang``,
  from the same source with only ``import sglang as sgl`` changed to
  ``import frontend_lang as sgl`` (read from the installed package at test time).

Programs that do not apply to a /generate backend are listed in ``NOT_APPLICABLE``; the
assertions about answer quality a 135M model cannot be relied on to meet are listed in
``QUALITY`` (they are evaluated and reported, not enforced); every other assertion of the
programs -- the structural ones -- must pass (all in tests/sglang_programs.py).
"""
from __future__ import annotations

import json
import re
import types
from typing import Any, Callable

import httpx
import pytest

from tests.helpers import server_harness
from tests.helpers.server_harness import shared_server
from tests.helpers.sglang_programs import (APPLICABLE, DEFAULT_MAX_NEW_TOKENS, NOT_APPLICABLE, PROGRAM_ARGS, QUALITY,
                             QUALITY_MISSES, CappedEndpoint, import_sglang, load_programs)

# ---------------------------------------------------------------------------- fast: native API
@pytest.fixture(scope="module")
def tiny(tiny_dir):
    return shared_server(tiny_dir)


def _post(srv, body: dict, **kw) -> httpx.Response:
    with srv.client() as c:
        return c.post("/generate", json=body, **kw)


def _assert_idle_invariants() -> None:
    s = server_harness._shared.wait_idle()["scheduler"]
    assert s["invariants_ok"], s["invariant_error"]
    assert s["held_slots"] == 0, s


@pytest.mark.parametrize("body,field", [
    ({"text": "hi", "sampling_paramz": {}}, "sampling_paramz"),
    ({"text": "hi", "sampling_params": {"max_new_token": 2}}, "sampling_params.max_new_token"),
    ({"text": "hi", "sampling_params": {"stop_regx": "a"}}, "sampling_params.stop_regx"),
    ({"text": "hi", "lora_path": "my-adapter"}, "lora_path"),
    ({"text": "hi", "lora_path": [None, "a"]}, "lora_path"),
    ({"text": "hi", "return_hidden_states": True}, "return_hidden_states"),
    ({"text": "hi", "image_data": "http://x/cat.png"}, "image_data"),
    ({"text": "hi", "sampling_params": {"ebnf": "root ::= a-rule-never-defined"}}, "sampling_params.ebnf"),
    ({"text": "hi", "sampling_params": {"structural_tag": "{}"}}, "sampling_params.structural_tag"),
    ({"text": "hi", "sampling_params": {"stop_regex": "(a"}}, "sampling_params.stop_regex"),
])
def test_unknown_or_unsupported_field_is_a_400_naming_it(tiny, body, field):
    r = _post(tiny, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["message"].startswith(field + ":"), err
    assert err["param"] == field


def test_sglang_fields_at_their_defaults_are_accepted(tiny):
    body = {"text": "hi", "sampling_params": {"max_new_tokens": 2, "temperature": 0, "custom_params": None,
                                              "stream_interval": 1, "spaces_between_special_tokens": False,
                                              "no_stop_trim": False, "stop_regex": None, "sampling_seed": 3},
            "lora_path": None, "return_hidden_states": False, "session_params": None, "custom_logit_processor": None,
            "priority": 5, "log_metrics": True, "modalities": [], "extra_key": "k", "return_logprob": [False]}
    r = _post(tiny, body)
    assert r.status_code == 200, r.text
    assert len(r.json()["output_ids"]) == 2
    _assert_idle_invariants()


def _greedy(srv, n: int, **sp: Any) -> dict:
    body = {"text": "Once upon a time", "sampling_params": {"max_new_tokens": n, "temperature": 0,
                                                            "ignore_eos": True, **sp}}
    r = _post(srv, body)
    assert r.status_code == 200, r.text
    return r.json()


def _spanning_regex(srv, tok) -> tuple[str, str, str]:
    """(full greedy text, a regex whose first match spans a token boundary, the text before it)."""
    out = _greedy(srv, 24)
    text, ids = out["text"], out["output_ids"]
    for k in range(1, len(ids) - 2):  # the boundary after token k
        cut = len(tok.decode(ids[:k]))
        for a, b in ((2, 2), (1, 2), (3, 3), (1, 1)):
            if cut - a < 0 or cut + b > len(text) or text[:cut] != tok.decode(ids[:k]):
                continue
            pattern = re.escape(text[cut - a: cut]) + f"[^\\n]{{{b}}}"
            m = re.search(pattern, text)
            if m is not None and m.start() == cut - a:
                return text, pattern, text[:cut - a]
    pytest.fail(f"no spanning match in {text!r}")


@pytest.fixture(scope="module")
def tok(tiny_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)


def test_stop_regex_spanning_tokens_is_trimmed(tiny, tok):
    text, pattern, before = _spanning_regex(tiny, tok)
    out = _greedy(tiny, 24, stop_regex=[pattern])
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": pattern}
    assert out["text"] == before
    kept = _greedy(tiny, 24, stop_regex=pattern, no_stop_trim=True)
    assert kept["meta_info"]["finish_reason"] == {"type": "stop", "matched": pattern}
    assert kept["text"].startswith(before) and re.search(pattern, kept["text"])
    assert kept["output_ids"] == out["output_ids"]
    _assert_idle_invariants()


def _stream(srv, sp: dict) -> list[dict]:
    body = {"text": "Once upon a time", "stream": True,
            "sampling_params": {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True, **sp}}
    chunks = []
    with srv.client() as c, c.stream("POST", "/generate", json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    return chunks


def test_stop_regex_streamed_never_shows_the_match_nor_shrinks(tiny, tok):
    text, pattern, before = _spanning_regex(tiny, tok)
    chunks = _stream(tiny, {"stop_regex": pattern})
    texts = [c["text"] for c in chunks]
    for a, b in zip(texts, texts[1:]):
        assert b.startswith(a)  # cumulative text never shrinks
    assert all(not re.search(pattern, t) for t in texts)
    assert texts[-1] == before and chunks[-1]["meta_info"]["finish_reason"]["matched"] == pattern
    kept = [c["text"] for c in _stream(tiny, {"stop_regex": pattern, "no_stop_trim": True})]
    assert all(b.startswith(a) for a, b in zip(kept, kept[1:]))
    assert re.search(pattern, kept[-1]) and kept[-1].startswith(before)
    _assert_idle_invariants()


def test_detok_state_holds_back_a_partial_regex_match():
    from radixserve.detokenizer.incremental import safe_text_len

    assert safe_text_len("total: 12", (), (r"\d+ apples",)) == len("total: ")
    assert safe_text_len("total: 12 pears", (), (r"\d+ apples",)) == len("total: 12 pears")
    assert safe_text_len("abc END", ("END",), (r"x+y",)) == len("abc ")


def test_detok_state_stop_regex_and_no_stop_trim(tok):
    """The detokenizer's per-request state (used by the server and the in-process Engine):
    streamed deltas never show the regex match, the final text is trimmed at it, and with
    no_stop_trim nothing is cut."""
    from radixserve.detokenizer.process import DetokState
    from radixserve.ipc.server_link import ReqOutput

    ids = tok.encode("The answer is 42 apples and more", add_special_tokens=False)
    pattern = r"\d+ apples"
    for no_trim in (False, True):
        state, shown = DetokState(tok, True, ()), ""
        for i, t in enumerate(ids):
            last = i == len(ids) - 1
            out = ReqOutput("r", [t], {"type": "stop", "matched": pattern} if last else None,
                            stop_regex=(pattern,), no_stop_trim=no_trim)
            state.update(out)
            shown += out.text
            assert no_trim or not re.search(r"\d", shown)  # "42" could start a match: held back
        assert shown == out.final_text
        assert shown == ("The answer is 42 apples and more" if no_trim else "The answer is ")


@pytest.fixture(scope="module")
def fl(tiny):
    import frontend_lang

    be = frontend_lang.RuntimeEndpoint(tiny.url, api_key=server_harness.API_KEY)
    yield be
    be.shutdown()


def test_frontend_lang_sglang_api_on_a_fork_branch(fl):
    import frontend_lang as sgl

    @sgl.function(num_api_spec_tokens=16)
    def prog(s):
        s += "Count:"
        forks = s.fork(2)
        forks[1] += " two" + sgl.gen("x", max_tokens=2, temperature=0)
        forks[0] += " one"
        forks += lambda i: f" [{i}]"
        forks.join("concate_and_append")
        with s.var_scope("tail"):
            s += " end" + sgl.gen_int("n", max_tokens=3)
        s["note"] = "set by the program"

    state = prog.run(backend=fl)
    assert state.error() is None, state.error()
    x = state.get_var("n")
    assert re.fullmatch(r"[-+]?[0-9]+[ \n]*", x), x
    assert state.text().startswith("Count: one [0] two") and " [1] end" in state.text()
    assert state["tail"] == " end" + x and state["note"] == "set by the program"
    outs = list(prog.run_batch([{}, {}], backend=fl, generator_style=True))
    assert len(outs) == 2 and all(o.error() is None for o in outs)
    _assert_idle_invariants()


def test_frontend_lang_refuses_what_has_no_meaning_here():
    import frontend_lang as sgl

    for call in (lambda: sgl.image("cat.png"), lambda: sgl.video("v.mp4", 4),
                 lambda: sgl.separate_reasoning(sgl.gen("x"))):  # no model_type (SGLang's parser needs one)
        with pytest.raises(sgl.ProgramError):
            call()
    with pytest.raises(ValueError, match="temperature"):
        sgl.select("c", ["a", "b"], temperature=0.7)
    with pytest.raises(ValueError, match="dtype"):
        sgl.gen("x", dtype=list)
    with pytest.raises(TypeError, match="top_q"):
        sgl.gen("x", top_q=0.5)


def _fields_of_sglang(module_path: str, start: str, end: str) -> set[str]:
    """The field names SGLang declares between ``start`` and ``end`` in its installed source."""
    import_sglang()
    import importlib.util

    src = open(importlib.util.find_spec(module_path).origin).read()
    body = src[src.index(start):src.index(end, src.index(start))]
    return set(re.findall(r"^\s+(\w+):", body, re.M))


def test_every_sglang_generate_field_is_known():
    from radixserve.server.protocol import GenerateReqInput, SamplingParamsIn

    top = _fields_of_sglang("sglang.srt.managers.io_struct", "class GenerateReqInput(BaseReq):",
                            "    def contains_mm_input")
    assert top | {"rid", "http_worker_ipc"} <= set(GenerateReqInput.model_fields)
    sampling = _fields_of_sglang("sglang.srt.sampling.sampling_params", "def __init__", ") -> None:")
    assert "stop_regex" in sampling and sampling <= set(SamplingParamsIn.model_fields)


# ---------------------------------------------------------------------------- slow: SGLang's programs
def test_the_lists_cover_every_program():
    mod = load_programs("sglang")
    programs = {n for n in vars(mod) if n.startswith("test_") and callable(getattr(mod, n))}
    assert programs == set(APPLICABLE) | set(NOT_APPLICABLE)
    assert set(QUALITY) <= set(APPLICABLE) and set(PROGRAM_ARGS) <= set(APPLICABLE)


@pytest.fixture(scope="module")
def sglang_programs(smol_server) -> Callable[[str], types.ModuleType]:
    """For "sglang" / "frontend_lang": the programs module, with that frontend's default
    backend set to the SmolLM2 server."""
    sglang = import_sglang()
    import frontend_lang

    modules = {name: load_programs(name) for name in ("sglang", "frontend_lang")}
    handles = {"sglang": types.SimpleNamespace(endpoint=sglang.RuntimeEndpoint(smol_server.url)),
               "frontend_lang": types.SimpleNamespace(endpoint=CappedEndpoint(smol_server.url))}
    from sglang.lang.ir import SglFunction

    saved = {f: dict(f.__kwdefaults__) for f in (SglFunction.run, SglFunction.run_batch)}
    for f in saved:
        f.__kwdefaults__["max_new_tokens"] = DEFAULT_MAX_NEW_TOKENS
    # a handle with ``endpoint`` is how SGLang's programs reach a Runtime's endpoint
    # (test_gen_min_new_tokens reads global_config.default_backend.endpoint)
    sglang.set_default_backend(handles["sglang"])
    frontend_lang.set_default_backend(handles["frontend_lang"])
    yield modules.__getitem__
    sglang.set_default_backend(None)
    frontend_lang.set_default_backend(None)
    for f, kwdefaults in saved.items():
        f.__kwdefaults__ = kwdefaults
    handles["frontend_lang"].endpoint.shutdown()
    if QUALITY_MISSES:
        print("\nquality assertions not met (reported, not enforced):\n  " + "\n  ".join(QUALITY_MISSES))


@pytest.mark.slow
@pytest.mark.parametrize("frontend", ["sglang", "frontend_lang"])
@pytest.mark.parametrize("program", APPLICABLE)
def test_sglang_program(sglang_programs, smol_server, program, frontend):
    getattr(sglang_programs(frontend), program)(**PROGRAM_ARGS.get(program, {}))
    s = smol_server.wait_idle()["scheduler"]
    assert s["invariants_ok"], s["invariant_error"]
    assert s["held_slots"] == 0, s
