"""Every model family against transformers in fp32, on tiny random checkpoints
(``tests/helpers/families.py``): greedy tokens and prompt logprobs, from a cold cache and from
the radix cache, under chunked prefill, under retraction and with n-gram speculation."""
from __future__ import annotations

import pytest

from tests.helpers.families import FAMILIES, WINDOW, build_family
from tests.helpers.models import hf_greedy, hf_prompt_logprobs, make_engine

GEN = {"max_new_tokens": 16, "temperature": 0}
ATOL = 1e-4


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory, smol_dir):
    path = str(tmp_path_factory.mktemp(request.param))
    hf = build_family(request.param, path, smol_dir)
    prompts = [list(range(300 + 7 * i, 300 + 7 * i + n)) for i, n in enumerate((5, 3 * WINDOW + 5, 130))]
    ref = [hf_greedy(hf, p, GEN["max_new_tokens"]) for p in prompts]
    return request.param, path, hf, prompts, ref


def _outputs(eng, prompts: list[list[int]]) -> list[list[int]]:
    return [o["output_ids"] for o in eng.generate(input_ids=prompts, sampling_params=GEN)]


def test_greedy_and_prompt_logprobs_match_transformers(family):
    name, path, hf, prompts, ref = family
    eng = make_engine(path, max_total_tokens=2048)
    assert _outputs(eng, prompts) == ref, name
    out = eng.generate(input_ids=prompts[2], sampling_params={"max_new_tokens": 1}, return_logprob=True,
                       logprob_start_len=0)
    got = [t[0] for t in out["meta_info"]["input_token_logprobs"][1:]]
    want = hf_prompt_logprobs(hf, prompts[2])
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < ATOL, name
    # the same prompts again: served from the radix cache
    again = eng.generate(input_ids=prompts, sampling_params=GEN)
    assert [o["output_ids"] for o in again] == ref, name
    assert all(o["meta_info"]["cached_tokens"] >= len(p) - 1 for o, p in zip(again, prompts))


def test_chunked_prefill_and_retraction_keep_transformers_tokens(family):
    name, path, _, prompts, ref = family
    eng = make_engine(path, max_total_tokens=260, chunked_prefill_size=16, new_token_ratio=0.05)
    assert _outputs(eng, prompts * 2) == ref * 2, name
    assert eng.stats()["retractions"] > 0


def test_ngram_speculation_keeps_transformers_tokens(family):
    name, path, _, prompts, ref = family
    eng = make_engine(path, max_total_tokens=2048, speculative_algorithm="ngram", speculative_num_tokens=4)
    assert _outputs(eng, prompts) == ref, name


@pytest.mark.parametrize("name", ["qwen3", "gemma3"])
def test_int8_weights_serve_other_dense_families(name, tmp_path, smol_dir):
    """``quantization=int8`` quantizes these families' linear layers too (their tied heads give
    wide top-2 margins, so int8 keeps transformers' fp32 greedy tokens)."""
    from radixserve.model.quant.linear import QuantLinear

    hf = build_family(name, str(tmp_path), smol_dir)
    eng = make_engine(str(tmp_path), dtype="bfloat16", quantization="int8", max_total_tokens=1024)
    assert isinstance(eng.runner.model.layers[0].self_attn.qkv_proj, QuantLinear)
    prompts = [list(range(300, 300 + n)) for n in (5, 3 * WINDOW + 5)]
    got = [o["output_ids"] for o in eng.generate(input_ids=prompts, sampling_params={**GEN, "max_new_tokens": 8})]
    assert got == [hf_greedy(hf, p, 8) for p in prompts], name
