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
programs -- the structural ones -- must pass.
"""
from __future__ import annotations

import ast
import importlib.machinery
import json
import re
import sys
import types
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest

import server_harness
from frontend_lang import RuntimeEndpoint as FrontendEndpoint
from server_harness import shared_server

# ---------------------------------------------------------------------------- the lists
NOT_APPLICABLE = {
    "test_image_qa": "needs image input; radixserve serves text-only models",
    "test_completion_speculative": "num_api_spec_tokens speculation is for API-model backends (OpenAI); "
                                   "it reads token_usage, which only SGLang's OpenAI backend keeps",
    "test_chat_completion_speculative": "the same, for OpenAI chat backends",
    "test_hellaswag_select": "downloads HellaSwag from GitHub (tests have no network) and is a 200-question "
                             "benchmark with a latency assertion",
}

# program -> assertions (as written in SGLang's source) about answer quality: a 135M model
# cannot be relied on to know these facts; they run and are reported, not enforced.
QUALITY = {
    "test_few_shot_qa": ('assert "washington" in', "assert answers == ["),
    "test_decode_int": ('assert int(ret["hours"]) == 24', 'assert int(ret["days"]) == 365'),
    "test_tool_use": ("assert int(ret[\"answer\"]) == lhs * rhs",),
    "test_react": ('assert "finland" in answer',),
}

# SGLang's own switch for its quality checks (what SGLang's CI passes for small models)
PROGRAM_ARGS = {"test_select": {"check_answer": False}, "test_expert_answer": {"check_answer": False},
                "test_parallel_encoding": {"check_answer": False}}

# max_new_tokens of the gens that set none (SGLang's run() default is 128): the 135M model
# fills a regex such as REGEX_INT with digits up to the limit, which costs minutes on 2 cores
DEFAULT_MAX_NEW_TOKENS = 32

APPLICABLE = ["test_few_shot_qa", "test_mt_bench", "test_select", "test_decode_int", "test_decode_json_regex",
              "test_decode_json", "test_expert_answer", "test_tool_use", "test_react", "test_parallel_decoding",
              "test_parallel_encoding", "test_stream", "test_regex", "test_dtype_gen", "test_gen_min_new_tokens"]


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
    ({"text": "hi", "sampling_params": {"ebnf": "root ::= \"a\""}}, "sampling_params.ebnf"),
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
    from radixserve.detokenizer.process import safe_text_len

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

    for call in (lambda: sgl.image("cat.png"), lambda: sgl.video("v.mp4", 4), lambda: sgl.separate_reasoning("x")):
        with pytest.raises(sgl.ProgramError):
            call()
    with pytest.raises(ValueError, match="temperature"):
        sgl.select("c", ["a", "b"], temperature=0.7)
    with pytest.raises(ValueError, match="dtype"):
        sgl.gen("x", dtype=list)
    with pytest.raises(TypeError, match="top_q"):
        sgl.gen("x", top_q=0.5)


# ---------------------------------------------------------------------------- slow: SGLang's programs
def _import_sglang() -> types.ModuleType:
    """``import sglang`` and its test programs.  ``sglang.srt.utils`` imports
    ``torchvision.io.decode_jpeg`` at import time and PyPI's torchvision is CUDA-only: a stub
    stands in while SGLang's modules load (it is removed again, so nothing else sees it)."""
    pytest.importorskip("sglang", reason="SGLang's client: make install (pip install --no-deps sglang==0.5.10.post1)")
    import transformers  # noqa: F401  (its availability checks must not see the stub)

    stubbed = "torchvision" not in sys.modules and importlib.util.find_spec("torchvision") is None
    if stubbed:
        tv, io = types.ModuleType("torchvision"), types.ModuleType("torchvision.io")
        tv.__spec__ = importlib.machinery.ModuleSpec("torchvision", None)
        io.__spec__ = importlib.machinery.ModuleSpec("torchvision.io", None)
        io.decode_jpeg, tv.io = None, io
        sys.modules.update({"torchvision": tv, "torchvision.io": io})
    try:
        import sglang
        import sglang.test.test_programs  # noqa: F401
    finally:
        if stubbed:
            del sys.modules["torchvision"], sys.modules["torchvision.io"]
    # test_gen_min_new_tokens counts tokens with SGLang's tokenizer loader, which needs the
    # SGLang server stack; transformers' AutoTokenizer loads the same tokenizer.
    helper = types.ModuleType("sglang.srt.utils.hf_transformers_utils")
    helper.get_tokenizer = lambda path, **kw: transformers.AutoTokenizer.from_pretrained(path)
    sys.modules.setdefault("sglang.srt.utils.hf_transformers_utils", helper)
    return sglang


class _Quality(ast.NodeTransformer):
    """Turns the ``QUALITY`` assertions into ``_quality(program, test, message)`` calls."""

    def __init__(self, src: str) -> None:
        self.src, self.fn = src, None

    def visit_FunctionDef(self, node: ast.FunctionDef) -> Any:
        outer, self.fn = self.fn, node.name if node.name in QUALITY else self.fn
        self.generic_visit(node)
        self.fn = outer
        return node

    def visit_Assert(self, node: ast.Assert) -> Any:
        text = ast.get_source_segment(self.src, node) or ""
        if self.fn is None or not any(text.startswith(q) for q in QUALITY[self.fn]):
            return node
        call = ast.Call(ast.Name("_quality", ast.Load()),
                        [ast.Constant(f"{self.fn}: {text.splitlines()[0]}"), node.test, node.msg or ast.Constant("")],
                        [])
        return ast.copy_location(ast.Expr(call), node)


QUALITY_MISSES: list[str] = []


def load_programs(frontend: str) -> types.ModuleType:
    """SGLang's test_programs.py, with ``import sglang as sgl`` made ``import frontend_lang as
    sgl`` when ``frontend`` is "frontend_lang", and the QUALITY assertions reported only."""
    sglang = _import_sglang()
    path = Path(sglang.__file__).parent / "test" / "test_programs.py"
    src = path.read_text()
    if frontend == "frontend_lang":
        src, count = re.subn(r"^(\s*)import sglang as sgl$", r"\1import frontend_lang as sgl", src, flags=re.M)
        assert count >= 1
    tree = ast.fix_missing_locations(_Quality(src).visit(ast.parse(src)))
    mod = types.ModuleType(f"sglang_test_programs_{frontend}")
    mod.__file__ = str(path)

    def _quality(program: str, ok: Any, message: Any) -> None:
        if not ok:
            QUALITY_MISSES.append(f"[{frontend}] {program} -- got: {str(message)[:200]!r}")

    mod._quality = _quality
    exec(compile(tree, str(path), "exec"), mod.__dict__)
    return mod


def test_the_lists_cover_every_program():
    mod = load_programs("sglang")
    programs = {n for n in vars(mod) if n.startswith("test_") and callable(getattr(mod, n))}
    assert programs == set(APPLICABLE) | set(NOT_APPLICABLE)
    assert set(QUALITY) <= set(APPLICABLE) and set(PROGRAM_ARGS) <= set(APPLICABLE)


class CappedEndpoint(FrontendEndpoint):
    """frontend_lang's RuntimeEndpoint with DEFAULT_MAX_NEW_TOKENS for gens that set none
    (frontend_lang leaves it to the server, whose default is SGLang's 128)."""

    def generate(self, text, sampling_params, options, on_text=None):
        sampling_params = {"max_new_tokens": DEFAULT_MAX_NEW_TOKENS, **sampling_params}
        return super().generate(text, sampling_params, options, on_text)


@pytest.fixture(scope="module")
def sglang_programs(smol_server) -> Callable[[str], types.ModuleType]:
    """For "sglang" / "frontend_lang": the programs module, with that frontend's default
    backend set to the SmolLM2 server."""
    sglang = _import_sglang()
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
