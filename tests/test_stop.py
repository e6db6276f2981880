"""Finish conditions (``radixserve.scheduler.stop``) through the Engine on the tiny random
Llama: stop strings across token boundaries, min_new_tokens and ignore_eos."""
from __future__ import annotations


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


def test_min_new_tokens_and_ignore_eos(tiny_engine):
    eos = tiny_engine.tokenizer.eos_token_id
    o = tiny_engine.generate(input_ids=[9, 10], sampling_params={
        "max_new_tokens": 6, "temperature": 0, "logit_bias": {eos: 1e4}, "min_new_tokens": 4})
    assert len(o["output_ids"]) == 5 and o["output_ids"][-1] == eos
    o = tiny_engine.generate(input_ids=[9, 10], sampling_params={
        "max_new_tokens": 6, "temperature": 0, "logit_bias": {eos: 1e4}, "ignore_eos": True})
    assert o["output_ids"] == [eos] * 6 and o["meta_info"]["finish_reason"]["type"] == "length"
