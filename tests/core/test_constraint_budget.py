"""``constraint_budget: "close"`` (constrained/schema/budget.py): near ``max_new_tokens`` the mask is
narrowed, never widened, toward the shortest valid ending, so outputs that "cut" leaves unfinished
finish valid; unit checks of the nesting count and the narrowing."""
from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest

from radixserve.constrained.schema import budget
from radixserve.sampling_params import SamplingParams
from tests.helpers.models import make_engine

SCHEMA = {"type": "object", "properties": {"title": {"type": "string"}, "tags": {"type": "array",
          "items": {"type": "string"}}, "n": {"type": "integer"}}, "required": ["title", "tags", "n"]}


def test_nesting_counts_brackets_outside_strings():
    assert budget.nesting(b'{"a": [1, {"b": "x]}') == (3, True)
    assert budget.nesting(b'{"a": "q\\"]}", "b": [') == (2, False)
    assert budget.nesting(b"") == (0, False)


class _Vocab:
    def __init__(self, tokens: list[bytes], eos: int) -> None:
        self.token_bytes = tokens
        self.size = len(tokens)
        self.eos_mask = np.zeros(self.size, dtype=bool)
        self.eos_mask[eos] = True


def test_closing_mask_narrows_only_near_the_end():
    vocab = _Vocab([b'{"a', b'"}', b"}", b'"', b"0", b"xyz", None], eos=6)
    out = [0]  # '{"a': one bracket and a string open -> reserve 2 + 1 + SLACK
    full = np.array([False, True, True, True, True, True, False])
    assert budget.closing_mask(full, vocab, out, 100) is full  # 100 > reserve + a quarter of 101
    got = budget.closing_mask(full, vocab, out, 2)
    assert got.tolist() == [False, True, False, True, False, False, False]  # in a string: what ends it
    closed = [0, 1]  # '{"a"}': nothing open, no string -> the bracket closers would come first
    assert budget.nesting(b'{"a"}') == (0, False) and budget.reserve(closed, vocab) == budget.SLACK
    only_text = np.array([False, False, False, False, False, True, False])
    assert budget.closing_mask(only_text, vocab, out, 2).tolist() == only_text.tolist()  # nothing else allowed
    with_eos = full.copy()
    with_eos[6] = True
    assert budget.closing_mask(with_eos, vocab, out, 1).tolist() == [False] * 6 + [True]


def test_bad_value_is_a_400_naming_the_field():
    with pytest.raises(ValueError, match="constraint_budget"):
        SamplingParams(json_schema=SCHEMA, constraint_budget="stretch").verify(100)


def test_close_finishes_what_cut_leaves_unfinished(tiny_dir):
    eng = make_engine(tiny_dir)
    prompts = [f"Item {i}: write a JSON record" for i in range(6)]
    runs = {}
    for mode in ("cut", "close"):
        outs = eng.generate(prompts, {"json_schema": SCHEMA, "max_new_tokens": 40, "temperature": 0,
                                      "constraint_budget": mode})
        runs[mode] = outs
    finished = {m: [o["meta_info"]["finish_reason"]["type"] == "stop" for o in outs] for m, outs in runs.items()}
    for o, done in zip(runs["close"], finished["close"]):
        if done:
            jsonschema.validate(json.loads(o["text"]), SCHEMA)
    assert sum(finished["close"]) > sum(finished["cut"]), finished
    eng.check_invariants()
    eng.shutdown()
