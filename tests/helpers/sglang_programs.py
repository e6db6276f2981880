"""SGLang's own frontend test programs (``sglang.test.test_programs``, sglang==0.5.10.post1) for
tests/frontend/test_sglang_compat.py: which apply, which assertions are about quality, and how they
are loaded -- as installed for SGLang's client, or with only ``import sglang as sgl``
changed to ``import frontend_lang as sgl``.
"""
from __future__ import annotations

import ast
import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from frontend_lang import RuntimeEndpoint as FrontendEndpoint

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
SUMMARY_TOKENS = 64  # test_parallel_decoding's summary (512 in SGLang's source)

APPLICABLE = ["test_few_shot_qa", "test_mt_bench", "test_select", "test_decode_int", "test_decode_json_regex",
              "test_decode_json", "test_expert_answer", "test_tool_use", "test_react", "test_parallel_decoding",
              "test_parallel_encoding", "test_stream", "test_regex", "test_dtype_gen", "test_gen_min_new_tokens"]


def import_sglang() -> types.ModuleType:
    """``import sglang`` and its test programs.  ``sglang.srt.utils`` imports
    ``torchvision.io.decode_jpeg`` at import time and PyPI's torchvision is CUDA-only: a stub
    stands in while SGLang's modules load (it is removed again, so nothing else sees it)."""
    pytest.importorskip("sglang", reason="SGLang's client: make install (pip install --no-deps sglang==0.5.10.post1)")
    import transformers  # noqa: F401  (its availability checks must not see the stub)

    from benchmarks.programs.sglang_client import import_sglang as import_with_stub

    sglang = import_with_stub()
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
    sgl`` when ``frontend`` is "frontend_lang", the QUALITY assertions reported only, and the
    parallel-decoding summary at ``SUMMARY_TOKENS``."""
    sglang = import_sglang()
    path = Path(sglang.__file__).parent / "test" / "test_programs.py"
    src = path.read_text()
    # test_parallel_decoding's summary asks for 512 tokens, about 20 s per client on 2 cores for
    # the 135M model; the program's structure (forks, joins, the summary gen) is what is tested
    src, count = re.subn(r'sgl\.gen\("summary", max_tokens=512\)',
                         f'sgl.gen("summary", max_tokens={SUMMARY_TOKENS})', src)
    assert count == 1, "SGLang's test_parallel_decoding changed: revisit SUMMARY_TOKENS"
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


class CappedEndpoint(FrontendEndpoint):
    """frontend_lang's RuntimeEndpoint with DEFAULT_MAX_NEW_TOKENS for gens that set none
    (frontend_lang leaves it to the server, whose default is SGLang's 128)."""

    def generate(self, text, sampling_params, options, on_text=None):
        sampling_params = {"max_new_tokens": DEFAULT_MAX_NEW_TOKENS, **sampling_params}
        return super().generate(text, sampling_params, options, on_text)
