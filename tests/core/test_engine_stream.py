"""``Engine.generate_stream`` goes through the server's detokenizer path: its cumulative text
never shrinks and never shows a stop string (nor the start of one), also when the stop
string spans a token boundary; the async variants give the same results."""
from __future__ import annotations

import asyncio

import pytest

from tests.helpers.models import make_engine

PROMPTS = ([20, 21, 22], [100, 200, 300], [1000, 2000, 3000, 4000])
# penalties make the random model's greedy output change tokens, so a boundary has text on both sides
GREEDY = {"max_new_tokens": 24, "temperature": 0, "frequency_penalty": 2.0, "presence_penalty": 2.0}


def _held(eng) -> int:
    s = eng.stats()
    return s["num_slots"] - s["free_slots"] - s["cache_size"]


def _boundaries(tok, ids: list[int]) -> list[int]:
    """Text offsets where one output token ends and the next begins."""
    return [len(tok.decode(ids[:k])) for k in range(1, len(ids))]


def _spanning_stop(tok, ids: list[int], text: str) -> tuple[str, int] | None:
    """A 4-character stop string whose first occurrence in ``text`` straddles a token boundary
    (2 characters each side) after some text, and that boundary."""
    for b in _boundaries(tok, ids):
        stop = text[b - 2: b + 2]
        if b >= 6 and len(stop) == 4 and stop.strip() and text.find(stop) == b - 2:
            return stop, b
    return None


def test_stream_never_shrinks_and_never_shows_a_spanning_stop_string(tiny_engine):
    eng, tok = tiny_engine, tiny_engine.tokenizer
    for prompt in PROMPTS:  # the first prompt whose greedy output has such a boundary
        base = eng.generate(input_ids=prompt, sampling_params=GREEDY)
        text, ids = base["text"], base["output_ids"]
        found = _spanning_stop(tok, ids, text)
        if found is not None:
            break
    assert found is not None, "no greedy output with a token boundary to put a stop string across"
    stop, b = found
    assert tok.decode(ids) == text
    # the stop string really spans tokens: no single output token's text contains it, and its
    # first occurrence starts before the boundary ``b`` and ends after it
    assert not any(stop in tok.decode([t]) for t in ids)
    assert b in _boundaries(tok, ids) and text.find(stop) < b < text.find(stop) + len(stop)

    chunks = list(eng.generate_stream(input_ids=prompt, sampling_params={**GREEDY, "stop": stop}))
    assert len(chunks) >= 2, "the stream produced no intermediate chunk"
    prev = ""
    for ch in chunks:
        assert ch["text"].startswith(prev), (prev, ch["text"])  # never shrinks
        assert stop not in ch["text"]
        prev = ch["text"]
    final = chunks[-1]
    assert final["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert final["text"] == text[: text.find(stop)]
    # nothing shown is taken back: every chunk is a prefix of the trimmed final text, so the
    # start of the stop string was held back while it could still complete
    assert all(final["text"].startswith(ch["text"]) for ch in chunks)
    assert any(len(ch["text"]) < len(final["text"]) for ch in chunks[:-1])
    assert final["text"] == eng.generate(input_ids=prompt, sampling_params={**GREEDY, "stop": stop})["text"]
    assert _held(eng) == 0
    eng.check_invariants()


def test_stream_chunks_match_the_server_shape(tiny_engine):
    chunks = list(tiny_engine.generate_stream(input_ids=[[30, 31], [40, 41, 42]],
                                              sampling_params={"max_new_tokens": 6, "temperature": 0},
                                              return_logprob=True, logprob_start_len=0))
    finals = {c["index"]: c for c in chunks if c["meta_info"]["finish_reason"] is not None}
    assert sorted(finals) == [0, 1]
    for c in finals.values():
        meta = c["meta_info"]
        assert set(meta) >= {"id", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens",
                             "e2e_latency", "input_token_logprobs", "output_token_logprobs"}
        assert meta["input_token_logprobs"][0][0] is None and len(meta["input_token_logprobs"][0]) == 3
        assert [e[1] for e in meta["output_token_logprobs"]] == c["output_ids"]
    tiny_engine.check_invariants()


def test_async_variants_match_the_blocking_ones(tiny_engine):
    sp = {**GREEDY, "stop": "\n"}
    want = tiny_engine.generate(input_ids=[[5, 6, 7], [8, 9]], sampling_params=sp)

    async def main():
        outs = await tiny_engine.async_generate(input_ids=[[5, 6, 7], [8, 9]], sampling_params=sp)
        last: dict[int, dict] = {}
        async for ch in tiny_engine.async_generate_stream(input_ids=[[5, 6, 7], [8, 9]], sampling_params=sp):
            assert ch["text"].startswith(last.get(ch["index"], {"text": ""})["text"])
            last[ch["index"]] = ch
        # several at once on one event loop
        many = await asyncio.gather(*[tiny_engine.async_generate(input_ids=[5, 6, 7], sampling_params=sp)
                                      for _ in range(4)])
        return outs, [last[i] for i in range(2)], many

    outs, streamed, many = asyncio.run(main())
    for w, o, s in zip(want, outs, streamed):
        assert o["output_ids"] == w["output_ids"] == s["output_ids"] and o["text"] == w["text"] == s["text"]
    assert all(m["output_ids"] == want[0]["output_ids"] for m in many)
    assert _held(tiny_engine) == 0
    tiny_engine.check_invariants()


def test_closed_stream_aborts_and_shutdown_fails_new_calls(tiny_dir):
    with make_engine(tiny_dir, max_total_tokens=2048) as eng:
        gen = eng.generate_stream(input_ids=[50, 51], sampling_params={"max_new_tokens": 200, "ignore_eos": True})
        next(gen)
        gen.close()
        assert eng.stats()["running"] == 0 and _held(eng) == 0
        eng.check_invariants()
    with pytest.raises(RuntimeError, match="shut down"):
        eng.generate(input_ids=[1, 2], sampling_params={"max_new_tokens": 1})


def test_cancelled_async_request_is_aborted_and_the_engine_goes_on(tiny_engine):
    long = {"max_new_tokens": 500, "ignore_eos": True, "temperature": 0}

    async def main():
        task = asyncio.ensure_future(tiny_engine.async_generate(input_ids=[70, 71], sampling_params=long))
        agen = tiny_engine.async_generate_stream(input_ids=[72, 73], sampling_params=long)
        await agen.__anext__()
        await agen.aclose()
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return await tiny_engine.async_generate(input_ids=[1, 2], sampling_params={"max_new_tokens": 3})

    out = asyncio.run(main())
    assert len(out["output_ids"]) <= 3
    assert tiny_engine.stats()["running"] == 0 and _held(tiny_engine) == 0
    tiny_engine.check_invariants()
