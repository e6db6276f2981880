"""``echo`` and prompt logprobs on /v1/completions (OpenAI's legacy API) against HF
transformers' prompt logprobs in fp32, on the shared tiny-model server: the scoring call of
lm-evaluation-harness (``echo=True, max_tokens=0, logprobs=1``), echo with a completion, token-id
prompts, n > 1, and streaming (the first chunk carries the prompt)."""
from __future__ import annotations

import json

import torch

from tests.helpers.models import hf_prompt_logprobs

PROMPT = "The capital of France is Paris, and the capital of Italy is"


def lp_close(got: list, ref: list) -> bool:
    return torch.allclose(torch.tensor(got, dtype=torch.float64), torch.tensor(ref, dtype=torch.float64), atol=1e-4)


def check_offsets(text: str, tokens: list[str], offsets: list[int]) -> None:
    assert "".join(tokens) == text  # ASCII prompt: the token strings spell the text
    assert offsets == [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]


def test_score_prompt_like_lm_eval(oai, tok, tiny_hf):
    ids = tok.encode(PROMPT)
    r = oai.completions.create(model="m", prompt=PROMPT, echo=True, max_tokens=0, logprobs=1, temperature=0)
    c = r.choices[0]
    assert c.text == PROMPT and c.finish_reason == "length" and r.usage.completion_tokens == 0
    lp = c.logprobs
    assert lp.tokens == [tok.decode([t]) for t in ids]
    assert lp.token_logprobs[0] is None and lp_close(lp.token_logprobs[1:], hf_prompt_logprobs(tiny_hf, ids))
    assert lp.top_logprobs[0] is None
    assert all(len(d) == 1 and max(d.values()) >= v - 1e-6 for d, v in zip(lp.top_logprobs[1:], lp.token_logprobs[1:]))
    check_offsets(c.text, lp.tokens, lp.text_offset)
    zero = oai.completions.create(model="m", prompt=ids, echo=True, max_tokens=0, logprobs=0)
    assert zero.choices[0].text == tok.decode(ids) and zero.choices[0].logprobs.top_logprobs is None
    assert zero.choices[0].logprobs.token_logprobs == lp.token_logprobs
    plain = oai.completions.create(model="m", prompt=PROMPT, echo=True, max_tokens=0)
    assert plain.choices[0].text == PROMPT and plain.choices[0].logprobs is None


def test_echo_with_completion_and_n(oai, server, tok, tiny_hf):
    ids = tok.encode(PROMPT)
    base = oai.completions.create(model="m", prompt=PROMPT, max_tokens=5, temperature=0, logprobs=2)
    r = oai.completions.create(model="m", prompt=PROMPT, max_tokens=5, temperature=0, logprobs=2, echo=True)
    c = r.choices[0]
    assert c.text == PROMPT + base.choices[0].text
    lp = c.logprobs
    n_out = len(base.choices[0].logprobs.tokens)
    assert len(lp.tokens) == len(ids) + n_out and lp.tokens[len(ids):] == base.choices[0].logprobs.tokens
    assert lp.token_logprobs[0] is None and lp_close(lp.token_logprobs[1:len(ids)], hf_prompt_logprobs(tiny_hf, ids))
    assert lp_close(lp.token_logprobs[len(ids):], base.choices[0].logprobs.token_logprobs)
    assert lp.text_offset[len(ids)] == len(PROMPT)
    assert all(len(d) == 2 for d in lp.top_logprobs[1:])
    many = oai.completions.create(model="m", prompt=["a b c", "x y z"], max_tokens=3, n=2, seed=1, echo=True)
    assert [ch.text[:5] for ch in many.choices] == ["a b c", "a b c", "x y z", "x y z"]
    s = server.wait_idle()["scheduler"]
    assert s["invariants_ok"] and s["held_slots"] == 0, s


def _stream(server, body: dict) -> list[dict]:
    with server.client() as http, http.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        lines = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(ln) for ln in lines[:-1]]


def test_stream_echo_first_chunk_carries_the_prompt(server, oai, tok):
    ids = tok.encode(PROMPT)
    body = {"model": "m", "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "echo": True, "logprobs": 1}
    full = oai.completions.create(**body)
    chunks = _stream(server, body)
    first = chunks[0]["choices"][0]
    assert first["text"].startswith(PROMPT) and first["logprobs"]["tokens"][:len(ids)] == full.choices[0].logprobs.tokens[:len(ids)]
    assert first["logprobs"]["token_logprobs"][0] is None
    assert "".join(ch["choices"][0]["text"] for ch in chunks) == full.choices[0].text
    tokens = [t for ch in chunks for t in ch["choices"][0]["logprobs"]["tokens"]]
    offsets = [o for ch in chunks for o in ch["choices"][0]["logprobs"]["text_offset"]]
    assert tokens == full.choices[0].logprobs.tokens and offsets == full.choices[0].logprobs.text_offset
    only = _stream(server, {**body, "max_tokens": 0})
    assert len(only) == 1 and only[0]["choices"][0]["text"] == PROMPT
    assert only[0]["choices"][0]["finish_reason"] == "length"
    s = server.wait_idle()["scheduler"]
    assert s["invariants_ok"] and s["held_slots"] == 0, s
