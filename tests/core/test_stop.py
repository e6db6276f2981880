"""Finish conditions (``radixserve.scheduler.stop``) through the Engine on the tiny random
Llama: stop strings across token boundaries, min_new_tokens and ignore_eos."""
from __future__ import annotations

import pytest


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


def test_stop_regex_through_the_engine_trims_and_streams_safely(tiny_engine):
    """SGLang's ``stop_regex`` on the in-process path: generation ends at the first match, the
    match is trimmed (kept with ``no_stop_trim``), and streamed text never shows it nor shrinks."""
    import re

    eng = tiny_engine
    sp = {"max_new_tokens": 24, "temperature": 0, "frequency_penalty": 2.0, "presence_penalty": 2.0}
    base = eng.generate(input_ids=[100, 200, 300], sampling_params=sp)
    text = base["text"]
    assert len(text) > 8
    pattern = re.escape(text[4]) + "." + re.escape(text[6])  # first match at or before offset 4
    first = re.search(pattern, text)
    o = eng.generate(input_ids=[100, 200, 300], sampling_params={**sp, "stop_regex": pattern})
    assert o["meta_info"]["finish_reason"] == {"type": "stop", "matched": pattern}
    assert o["text"] == text[: first.start()]
    kept = eng.generate(input_ids=[100, 200, 300], sampling_params={**sp, "stop_regex": [pattern],
                                                                     "no_stop_trim": True})
    assert kept["text"].startswith(text[: first.end()]) and re.search(pattern, kept["text"])
    prev = ""
    for ch in eng.generate_stream(input_ids=[100, 200, 300], sampling_params={**sp, "stop_regex": pattern}):
        assert ch["text"].startswith(prev) and not re.search(pattern, ch["text"])
        prev = ch["text"]
    assert prev == o["text"]
    eng.check_invariants()


@pytest.mark.timeout(120)
def test_catastrophic_stop_regex_is_bounded(tiny_engine):
    """A stop_regex that backtracks exponentially on the output ("(a|aa)*\\d" on "aaaa...") ends
    (its searches time out) instead of hanging the detokenizer; overlong ones are refused."""
    a = tiny_engine.tokenizer.encode("a")[-1]
    sp = {"max_new_tokens": 40, "temperature": 0, "logit_bias": {a: 1e4}, "stop_regex": r"(a|aa)*\d"}
    o = tiny_engine.generate(input_ids=[100, 200], sampling_params=sp)
    assert set(o["text"]) <= {"a"} and len(o["output_ids"]) <= 40
    fr = o["meta_info"]["finish_reason"]
    assert fr["type"] == "length" or (fr["type"] == "abort" and fr["message"].startswith("stop_regex:")), fr
    chunks = list(tiny_engine.generate_stream(input_ids=[100, 200], sampling_params=sp))
    assert chunks and chunks[-1]["meta_info"]["finish_reason"]["type"] in ("length", "abort")
    with pytest.raises(ValueError, match="stop_regex"):
        tiny_engine.generate(input_ids=[1], sampling_params={"stop_regex": "x" * 100000})
    with pytest.raises(ValueError, match="stop"):
        tiny_engine.generate(input_ids=[1], sampling_params={"stop": ["x"] * 5000})
