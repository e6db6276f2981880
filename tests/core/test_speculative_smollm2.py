"""Speculative decoding on the real SmolLM2 weights: greedy outputs equal HF fp32 token for
token, on the core prompts and on RAG-style prompts that ask for a passage to be repeated
(where n-gram proposals are accepted)."""
from __future__ import annotations

import pytest

from tests.helpers.models import hf_greedy, make_engine
from tests.helpers.smol_prompts import QUESTIONS, chat_prompt

pytestmark = pytest.mark.slow

PASSAGE = ("The radix tree stores every prompt that the server has seen, so a new request that shares "
           "a prefix with an old one skips the computation of that prefix.")


def _prompts(tok) -> list[list[int]]:
    chat = [tok.encode(chat_prompt(QUESTIONS[0]))]
    ask = [{"role": "user", "content": f"Repeat this passage word for word:\n\n{PASSAGE}"}]
    quote = [tok.encode(tok.apply_chat_template(ask, tokenize=False, add_generation_prompt=True)),
             tok.encode(f"Document: {PASSAGE}\nQuote the document exactly.\nQuote: {PASSAGE[:40]}")]
    return chat + quote


@pytest.fixture(scope="module")
def refs(smol_dir, smol_hf):
    """The prompts and HF fp32 greedy continuations (32 tokens), computed once."""
    from transformers import AutoTokenizer

    prompts = _prompts(AutoTokenizer.from_pretrained(smol_dir))
    return prompts, [hf_greedy(smol_hf, p, 32) for p in prompts]


def test_ngram_greedy_equals_hf(smol_dir, refs):
    prompts, greedy = refs
    eng = make_engine(smol_dir, max_total_tokens=4000, speculative_algorithm="ngram", speculative_num_tokens=5)
    outs = eng.generate(input_ids=prompts, sampling_params={"max_new_tokens": 32, "temperature": 0})
    assert [o["output_ids"] for o in outs] == greedy
    quoted = [o["meta_info"]["spec_accepted_tokens"] for o in outs[1:]]
    assert all(a >= 8 for a in quoted), [o["meta_info"] for o in outs]
    eng.check_invariants()


def test_smollm2_as_its_own_draft_accepts_every_token(smol_dir, refs):
    prompts, greedy = refs
    eng = make_engine(smol_dir, max_total_tokens=3000, speculative_algorithm="draft",
                      speculative_draft_model=smol_dir, speculative_num_tokens=4)
    outs = eng.generate(input_ids=prompts[:2], sampling_params={"max_new_tokens": 32, "temperature": 0})
    assert [o["output_ids"] for o in outs] == greedy[:2]
    for o in outs:
        meta = o["meta_info"]
        assert meta["spec_proposed_tokens"] > 0 and meta["spec_accepted_tokens"] == meta["spec_proposed_tokens"], meta
    eng.check_invariants()
