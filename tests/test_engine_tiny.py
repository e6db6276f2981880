"""Every Engine path on the tiny random Llama, checked against HF transformers in fp32."""
from __future__ import annotations

import random

import pytest
import torch

from conftest import hf_greedy, hf_prompt_logprobs, make_engine

SYSTEM = list(range(1000, 1100))  # a shared 100-token "system prompt"


def _prompts(seed: int, n: int) -> list[list[int]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        body = [rng.randrange(200, 40000) for _ in range(rng.randrange(1, 60))]
        out.append((SYSTEM + body) if i % 2 == 0 else body)
    return out


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


def test_seeded_sampling_is_reproducible_and_batch_independent(tiny_engine):
    sp = {"max_new_tokens": 16, "temperature": 30.0, "top_p": 0.95, "top_k": 500, "seed": 1234}
    a = tiny_engine.generate(input_ids=[11, 12, 13], sampling_params=sp)
    batch = tiny_engine.generate(input_ids=[[5, 6], [11, 12, 13], [7] * 30], sampling_params=sp)
    assert a["output_ids"] == batch[1]["output_ids"]
    other = tiny_engine.generate(input_ids=[11, 12, 13], sampling_params={**sp, "seed": 99})
    assert other["output_ids"] != a["output_ids"]


def test_top_k_1_and_temperature_0_are_greedy(tiny_engine, tiny_hf):
    ids = [300, 301, 302, 303]
    ref = hf_greedy(tiny_hf, ids, 10)
    for sp in ({"temperature": 0}, {"top_k": 1, "temperature": 0.7}):
        assert tiny_engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 10, **sp})["output_ids"] == ref


def test_sampling_filters_respect_support(tiny_engine):
    ids = [400, 401]
    greedy = tiny_engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 1, "temperature": 0})
    for sp in ({"top_p": 1e-6}, {"min_p": 1.0}):
        o = tiny_engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 1, "temperature": 1.0, **sp})
        assert o["output_ids"] == greedy["output_ids"]


def test_logit_bias_and_stop_token_ids(tiny_engine):
    o = tiny_engine.generate(input_ids=[9, 9, 9], sampling_params={
        "max_new_tokens": 5, "temperature": 0, "logit_bias": {777: 1e4}})
    assert o["output_ids"] == [777] * 5
    o = tiny_engine.generate(input_ids=[9, 9, 9], sampling_params={
        "max_new_tokens": 5, "temperature": 0, "logit_bias": {777: 1e4}, "stop_token_ids": [777]})
    assert o["output_ids"] == [777] and o["meta_info"]["finish_reason"] == {"type": "stop", "matched": 777}


def test_min_new_tokens_and_ignore_eos(tiny_engine):
    eos = tiny_engine.tokenizer.eos_token_id
    o = tiny_engine.generate(input_ids=[9, 10], sampling_params={
        "max_new_tokens": 6, "temperature": 0, "logit_bias": {eos: 1e4}, "min_new_tokens": 4})
    assert len(o["output_ids"]) == 5 and o["output_ids"][-1] == eos
    o = tiny_engine.generate(input_ids=[9, 10], sampling_params={
        "max_new_tokens": 6, "temperature": 0, "logit_bias": {eos: 1e4}, "ignore_eos": True})
    assert o["output_ids"] == [eos] * 6 and o["meta_info"]["finish_reason"]["type"] == "length"


def test_repetition_and_frequency_penalties(tiny_engine, tiny_hf):
    ids = [500, 501, 502, 503]
    o = tiny_engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 12, "temperature": 0,
                                                             "repetition_penalty": 1.3})
    ref = tiny_hf.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False, repetition_penalty=1.3,
                           pad_token_id=0)[0, 4:].tolist()
    assert o["output_ids"] == ref[: len(o["output_ids"])]


def test_penalties_on_crafted_logits():
    from radixserve.sampling_params import SamplingParams
    from radixserve.worker.sampler import Sampler, make_state

    sp = SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    st = make_state(sp, None, (0,), 6, prompt_ids=[1], output_ids=[2, 2, 3], device="cpu")
    logits = torch.tensor([[1.0, 4.0, 4.0, -4.0, 4.0, 0.0]])
    out = Sampler(6, torch.device("cpu")).process(logits.clone(), [st], [3], [None])[0].tolist()
    # token 1: prompt only -> /2; token 2: seen, twice -> /2 - 2*0.5 - 0.25; token 3: negative -> *2, once
    assert out == pytest.approx([1.0, 2.0, 2.0 - 1.0 - 0.25, -8.0 - 0.5 - 0.25, 4.0, 0.0])


def test_stop_strings_across_token_boundaries(tiny_engine):
    tok = tiny_engine.tokenizer
    base = tiny_engine.generate(input_ids=[20, 21, 22], sampling_params={"max_new_tokens": 20, "temperature": 0})
    text = base["text"]
    assert len(text) > 6
    stop = text[3:6]  # a substring that need not align with token boundaries
    o = tiny_engine.generate(input_ids=[20, 21, 22], sampling_params={"max_new_tokens": 20, "temperature": 0,
                                                                      "stop": [stop]})
    assert o["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert o["text"] == text[: text.find(stop)]
    assert tok.decode(o["output_ids"]).find(stop) >= 0


def test_n_copies_share_the_prompt(tiny_engine):
    prompt = list(range(2000, 2080))
    outs = tiny_engine.generate(input_ids=prompt, sampling_params={"max_new_tokens": 8, "temperature": 30.0,
                                                                  "n": 4, "seed": 7})
    assert len(outs) == 4
    assert len({tuple(o["output_ids"]) for o in outs}) > 1
    assert sum(o["meta_info"]["cached_tokens"] >= len(prompt) - 1 for o in outs) >= 3


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


def test_disable_radix_cache(tiny_dir, tiny_hf):
    eng = make_engine(tiny_dir, disable_radix_cache=True)
    prompts = _prompts(3, 4)
    outs = eng.generate(input_ids=prompts + prompts, sampling_params={"max_new_tokens": 8, "temperature": 0})
    for p, o in zip(prompts + prompts, outs):
        assert o["output_ids"] == hf_greedy(tiny_hf, p, 8)
        assert o["meta_info"]["cached_tokens"] == 0
    eng.check_invariants()
    s = eng.stats()
    assert s["free_slots"] == s["num_slots"]


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


def test_text_prompts_and_long_outputs_are_clamped(tiny_engine):
    o = tiny_engine.generate("Hello there", {"max_new_tokens": 10**6, "temperature": 0, "ignore_eos": True,
                                             "stop_token_ids": [0]})
    assert o["meta_info"]["prompt_tokens"] == len(tiny_engine.tokenizer.encode("Hello there"))
    assert o["meta_info"]["completion_tokens"] <= 1024
