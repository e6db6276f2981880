"""The native API of the real multi-process server (tiny random Llama): equivalence with
the in-process Engine, streaming, prefix caching, logprobs, stop strings, admin routes."""
from __future__ import annotations

import json
import random

import httpx
import pytest

from tests.helpers.models import make_engine
from tests.helpers.server_harness import shared_server

PROMPTS = ["The capital of France is", "Once upon a time", "def fib(n):", "ÄÖÜ 漢字 emoji 🎉 test"]


@pytest.fixture(scope="session")
def server(tiny_dir):
    return shared_server(tiny_dir)


@pytest.fixture(scope="module")
def engine(tiny_dir):
    return make_engine(tiny_dir)


@pytest.fixture(scope="module")
def client(server):
    with server.client() as c:
        yield c


def sse_chunks(lines) -> list[dict]:
    chunks, done = [], False
    for line in lines:
        if not line:
            continue
        assert line.startswith("data: "), line
        if line == "data: [DONE]":
            done = True
            continue
        chunks.append(json.loads(line[6:]))
    assert done, "stream did not end with [DONE]"
    return chunks


def test_greedy_equals_engine_and_stream(client, engine):
    sp = {"max_new_tokens": 16, "temperature": 0}
    ref = engine.generate(PROMPTS, sp)
    got = client.post("/generate", json={"text": PROMPTS, "sampling_params": sp}).json()
    assert [g["output_ids"] for g in got] == [r["output_ids"] for r in ref]
    assert [g["text"] for g in got] == [r["text"] for r in ref]
    one = client.post("/generate", json={"input_ids": engine.tokenizer.encode(PROMPTS[0]), "sampling_params": sp})
    assert one.json()["output_ids"] == ref[0]["output_ids"]
    assert one.json()["meta_info"]["finish_reason"] == {"type": "length", "length": 16}
    for prompt, r in zip(PROMPTS, ref):
        with client.stream("POST", "/generate", json={"text": prompt, "sampling_params": sp, "stream": True}) as resp:
            assert resp.status_code == 200
            chunks = sse_chunks(resp.iter_lines())
        texts = [c["text"] for c in chunks]
        assert all(b.startswith(a) for a, b in zip(texts, texts[1:])), texts  # cumulative
        assert texts[-1] == r["text"] and chunks[-1]["output_ids"] == r["output_ids"]
        assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"


def test_stop_string_trimmed_in_stream(client, engine):
    base = client.post("/generate", json={"text": PROMPTS[1], "sampling_params": {"max_new_tokens": 24,
                                                                                 "temperature": 0}}).json()
    text = base["text"]
    stop = text[len(text) // 2: len(text) // 2 + 4]
    want = text[: text.find(stop)]
    body = {"text": PROMPTS[1], "sampling_params": {"max_new_tokens": 24, "temperature": 0, "stop": stop}}
    out = client.post("/generate", json=body).json()
    assert out["text"] == want and out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    with client.stream("POST", "/generate", json={**body, "stream": True}) as resp:
        chunks = sse_chunks(resp.iter_lines())
    assert all(stop not in c["text"] and want.startswith(c["text"]) for c in chunks)
    assert chunks[-1]["text"] == want


def test_prefix_cache_and_prefill_only(client, server):
    rng = random.Random(7)
    prefix = [rng.randrange(300, 40000) for _ in range(400)]
    warm = client.post("/generate", json={"input_ids": prefix, "sampling_params": {"max_new_tokens": 0}}).json()
    assert warm["meta_info"]["finish_reason"] == {"type": "length", "length": 0} and warm["output_ids"] == []
    for tail in ([11, 12, 13], [21, 22]):
        out = client.post("/generate", json={"input_ids": prefix + tail, "sampling_params": {"max_new_tokens": 4}})
        assert out.json()["meta_info"]["cached_tokens"] >= len(prefix) - 1
    info = server.wait_idle()
    assert info["scheduler"]["cache_size"] >= len(prefix)


def test_logprobs_match_engine(client, engine):
    ids = engine.tokenizer.encode(PROMPTS[2])
    kw = dict(return_logprob=True, logprob_start_len=0, top_logprobs_num=3)
    ref = engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 5, "temperature": 0}, **kw)
    got = client.post("/generate", json={"input_ids": ids, "sampling_params": {"max_new_tokens": 5, "temperature": 0},
                                         "return_text_in_logprobs": True, **kw}).json()
    meta, rmeta = got["meta_info"], ref["meta_info"]
    inp = meta["input_token_logprobs"]
    assert len(inp) == len(ids) and inp[0][0] is None and [e[1] for e in inp] == ids
    assert all(abs(a[0] - b[0]) < 1e-4 for a, b in zip(inp[1:], rmeta["input_token_logprobs"][1:]))
    out = meta["output_token_logprobs"]
    assert [e[1] for e in out] == got["output_ids"] == ref["output_ids"]
    assert all(abs(a[0] - b[0]) < 1e-4 for a, b in zip(out, rmeta["output_token_logprobs"]))
    assert all(isinstance(e[2], str) for e in out)
    assert len(meta["output_top_logprobs"][0]) == 3 and meta["input_top_logprobs"][0] is None


def test_n_and_seed_are_reproducible(client):
    body = {"text": PROMPTS[0], "sampling_params": {"max_new_tokens": 8, "temperature": 1.0, "n": 3, "seed": 5}}
    a = client.post("/generate", json=body).json()
    b = client.post("/generate", json=body).json()
    assert len(a) == 3 and [x["output_ids"] for x in a] == [x["output_ids"] for x in b]


def test_admin_routes(client, server):
    assert client.get("/get_model_info").json()["is_generation"] is True
    assert client.get("/health_generate").status_code == 200
    assert httpx.get(server.url + "/health").status_code == 200  # no key needed
    assert httpx.get(server.url + "/metrics").status_code == 401
    bad = httpx.post(server.url + "/generate", json={"text": "x"}, headers={"Authorization": "Bearer nope"})
    assert bad.status_code == 401 and "authorization" in bad.json()["error"]["message"]
    server.wait_idle()
    assert client.post("/flush_cache").json()["success"] is True
    info = server.wait_idle()
    assert info["scheduler"]["cache_size"] == 0 and info["scheduler"]["invariants_ok"]
    text = client.get("/metrics").text
    for name in ("time_to_first_token_seconds_count", "inter_token_latency_seconds", "e2e_request_latency_seconds",
                 "queue_time_seconds", "prompt_tokens_total", "generation_tokens_total", "cached_tokens_total",
                 "requests_total", "num_running_reqs", "num_queued_reqs", "kv_slot_usage", "cache_hit_rate"):
        assert "radixserve:" + name in text, name

