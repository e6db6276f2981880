"""Engine paths on the tiny random Llama, checked against HF transformers in fp32: greedy
decoding under both schedule policies with and without chunked prefill, prompt and output
logprobs, streaming that assembles to the blocking result, and bad input naming the field."""
from __future__ import annotations

import pytest
import torch

from tests.helpers.models import SYSTEM, hf_greedy, hf_prompt_logprobs, make_engine
from tests.helpers.models import random_prompts as _prompts


@pytest.mark.parametrize("chunk", [None, 16])
@pytest.mark.parametrize("policy", ["lpm", "fcfs"])
def test_greedy_matches_hf(tiny_dir, tiny_hf, chunk, policy):
    eng = make_engine(tiny_dir, chunked_prefill_size=chunk, schedule_policy=policy)
    warm = eng.generate(input_ids=SYSTEM + [5, 6, 7], sampling_params={"max_new_tokens": 0})
    assert warm["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
    prompts = _prompts(1, 10)
    outs = eng.generate(input_ids=prompts, sampling_params={"max_new_tokens": 24, "temperature": 0})
    for p, o in zip(prompts, outs):
        assert o["output_ids"] == hf_greedy(tiny_hf, p, 24)
    hits = [o["meta_info"]["cached_tokens"] for o in outs]
    assert all(h >= len(SYSTEM) for h in hits[0::2]), hits
    eng.check_invariants()
    assert eng.stats()["running"] == 0 and eng.stats()["protected_size"] == 0


@pytest.mark.parametrize("chunk", [None, 7])
def test_prompt_logprobs_match_hf(tiny_dir, tiny_hf, chunk):
    eng = make_engine(tiny_dir, chunked_prefill_size=chunk)
    prompts = _prompts(2, 4)
    eng.generate(input_ids=prompts[0], sampling_params={"max_new_tokens": 0})  # warm the cache
    outs = eng.generate(input_ids=prompts, sampling_params={"max_new_tokens": 3, "temperature": 0},
                        return_logprob=True, logprob_start_len=0, top_logprobs_num=3)
    for p, o in zip(prompts, outs):
        got = o["meta_info"]["input_token_logprobs"]
        assert got[0][0] is None and got[0][1] == p[0] and len(got) == len(p)
        ref = hf_prompt_logprobs(tiny_hf, p)
        assert [t[1] for t in got[1:]] == p[1:]
        assert torch.allclose(torch.tensor([t[0] for t in got[1:]]), torch.tensor(ref), atol=1e-4)
        top = o["meta_info"]["input_top_logprobs"][1]
        assert len(top) == 3 and top[0][0] >= got[1][0] - 1e-6
        out_lp = o["meta_info"]["output_token_logprobs"]
        assert [t[1] for t in out_lp] == o["output_ids"]
        full = p + o["output_ids"]
        ref_out = hf_prompt_logprobs(tiny_hf, full)[len(p) - 1:]
        assert torch.allclose(torch.tensor([t[0] for t in out_lp]), torch.tensor(ref_out), atol=1e-4)
    # a start offset: only positions >= start are scored
    o = eng.generate(input_ids=prompts[1], sampling_params={"max_new_tokens": 1}, return_logprob=True,
                     logprob_start_len=5)
    assert len(o["meta_info"]["input_token_logprobs"]) == len(prompts[1]) - 5
    eng.check_invariants()


def test_streaming_assembles_to_the_same_text(tiny_engine):
    sp = {"max_new_tokens": 24, "temperature": 0}
    full = tiny_engine.generate(input_ids=[[30, 31], [40, 41, 42]], sampling_params=sp)
    last: dict[int, dict] = {}
    for chunk in tiny_engine.generate_stream(input_ids=[[30, 31], [40, 41, 42]], sampling_params=sp):
        prev = last.get(chunk["index"])
        if prev is not None:
            assert chunk["text"].startswith(prev["text"])
        last[chunk["index"]] = chunk
    assert [last[i]["text"] for i in range(2)] == [f["text"] for f in full]
    assert all(last[i]["meta_info"]["finish_reason"] is not None for i in range(2))
    # an abandoned stream aborts its request and frees its slots
    gen = tiny_engine.generate_stream(input_ids=[50, 51], sampling_params={"max_new_tokens": 50, "ignore_eos": True})
    next(gen)
    gen.close()
    assert tiny_engine.stats()["running"] == 0
    tiny_engine.check_invariants()


@pytest.mark.parametrize("bad,field", [
    ({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"), ({"top_p": 1.5}, "top_p"),
    ({"top_k": -5}, "top_k"), ({"max_new_tokens": -1}, "max_new_tokens"), ({"min_p": 2}, "min_p"),
    ({"max_new_tokens": "x"}, "max_new_tokens"), ({"frequency_penalty": 3}, "frequency_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"), ({"n": 0}, "n"), ({"stop": [""]}, "stop"),
    ({"stop_token_ids": [10**9]}, "stop_token_ids"), ({"logit_bias": {"a": 1}}, "logit_bias"),
    ({"seed": 1.5}, "seed"), ({"bogus": 1}, "bogus"), ({"min_new_tokens": 5, "max_new_tokens": 2}, "min_new_tokens"),
])
def test_bad_sampling_params_name_the_field(tiny_engine, bad, field):
    with pytest.raises(ValueError, match=field):
        tiny_engine.generate(input_ids=[1, 2, 3], sampling_params=bad)


def test_bad_prompts(tiny_engine):
    with pytest.raises(ValueError, match="input_ids"):
        tiny_engine.generate(input_ids=[], sampling_params={})
    with pytest.raises(ValueError, match="input_ids"):
        tiny_engine.generate(input_ids=[10**8], sampling_params={})
    with pytest.raises(ValueError, match="input_ids"):
        tiny_engine.generate(input_ids=list(range(5000)), sampling_params={})
    tiny_engine.check_invariants()
