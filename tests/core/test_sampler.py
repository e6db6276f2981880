"""The sampler (``radixserve.worker.sampler``) through the Engine on the tiny random Llama:
seeded sampling, top-k / top-p / min-p, logit_bias and penalties (against HF transformers,
and on crafted logits)."""
from __future__ import annotations

import pytest
import torch

from tests.helpers.models import hf_greedy


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


def test_changes_logits_is_true_whenever_process_writes():
    """The model runner skips copying the logits when ``changes_logits`` is False: then
    ``process`` must leave them untouched (and it does write when it is True)."""
    from radixserve.sampling_params import SamplingParams
    from radixserve.worker.sampler import Sampler, make_state

    sampler = Sampler(6, torch.device("cpu"))
    cases = [(SamplingParams(), 0, None), (SamplingParams(temperature=0.7, top_k=3), 4, None),
             (SamplingParams(logit_bias={2: 5.0}), 0, None), (SamplingParams(presence_penalty=0.5), 1, None),
             (SamplingParams(min_new_tokens=3), 1, None),
             (SamplingParams(), 0, torch.tensor([True, True, False, True, True, True]))]
    for sp, n, mask in cases:
        st = make_state(sp, None, (0,), 6, prompt_ids=[1], output_ids=[2] * n, device="cpu")
        logits = torch.tensor([[1.0, 4.0, 4.0, -4.0, 4.0, 0.0]])
        changes = sampler.changes_logits([st], [n], [mask])
        out = sampler.process(logits.clone(), [st], [n], [mask])
        assert changes == (not torch.equal(out, logits)), sp
