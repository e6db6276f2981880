"""Embeddings (``Engine.encode`` and POST /v1/embeddings) on the tiny random Llama, fp32.

The reference is HF transformers' last hidden state (after the final norm), pooled by the
last token or the mean, L2-normalized.  Also: batched equals one by one, a cached-prefix
request equals an uncached one, chunked prefill changes nothing, the server gives the
Engine's vectors (the official ``openai`` client with its default base64 encoding, and
plain float JSON), bad input gets a 400 naming ``input``, and no KV slot is left held."""
from __future__ import annotations

import numpy as np
import openai
import pytest
import torch

from tests.helpers.models import make_engine
from tests.helpers.server_harness import API_KEY

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Radix trees share prefixes.",
         "The quick brown fox jumps over the lazy cat, then sleeps."]
TOL = 1e-5


@pytest.fixture(scope="module")
def eng(tiny_dir):
    e = make_engine(tiny_dir, chunked_prefill_size=16)
    yield e
    e.shutdown()


def hf_embedding(hf, ids: list[int], pooling: str) -> np.ndarray:
    with torch.no_grad():
        h = hf(torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0]
    v = h[-1] if pooling == "last" else h.mean(0)
    return torch.nn.functional.normalize(v, dim=0).numpy()


def close(a, b) -> bool:
    return np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)).max() <= TOL


def idle_ok(eng) -> None:
    eng.check_invariants()
    s = eng.stats()
    assert s["running"] == 0 and s["waiting"] == 0 and s["protected_size"] == 0, s


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_engine_matches_hf_batched_and_cached(eng, tiny_hf, pooling):
    eng.flush_cache()
    ids = [eng.tokenizer.encode(t) for t in TEXTS]
    singles = [eng.encode(t, pooling=pooling) for t in TEXTS]
    for i, s in zip(ids, singles):
        assert len(s["embedding"]) == 64 and abs(np.linalg.norm(s["embedding"]) - 1) < 1e-5
        assert close(s["embedding"], hf_embedding(tiny_hf, i, pooling))
        assert s["meta_info"]["prompt_tokens"] == len(i) and s["meta_info"]["completion_tokens"] == 0
    batched = eng.encode(TEXTS, pooling=pooling)
    assert all(close(a["embedding"], b["embedding"]) for a, b in zip(singles, batched))
    # the same prompts again: "last" reuses the cached prefix, "mean" recomputes every position
    hits = [o["meta_info"]["cached_tokens"] for o in eng.encode(input_ids=ids, pooling=pooling)]
    assert hits == ([len(i) - 1 for i in ids] if pooling == "last" else [0, 0, 0])
    again = eng.encode(input_ids=ids, pooling=pooling)
    assert all(close(a["embedding"], b["embedding"]) for a, b in zip(singles, again))
    idle_ok(eng)


def test_engine_prefix_hit_chunks_and_options(eng, tiny_dir):
    eng.flush_cache()
    prefix, full = TEXTS[0], TEXTS[0] + " And then some more words follow here."
    cold = eng.encode(full)["embedding"]
    eng.flush_cache()
    eng.encode(prefix)
    warm = eng.encode(full)
    assert warm["meta_info"]["cached_tokens"] >= len(eng.tokenizer.encode(prefix)) - 1
    assert close(cold, warm["embedding"])
    raw = eng.encode(full, normalize=False)["embedding"]
    assert close(np.asarray(raw) / np.linalg.norm(raw), cold) and abs(np.linalg.norm(raw) - 1) > 1e-3
    other = make_engine(tiny_dir, embedding_pooling="mean", chunked_prefill_size=None)
    try:  # the config default, and no chunking: the same mean as 16-token chunks
        assert close(other.encode(full)["embedding"], eng.encode(full, pooling="mean")["embedding"])
    finally:
        other.shutdown()
    for kw, field in ((dict(prompt=""), "text"), (dict(input_ids=[[1, 2], []]), "input_ids.1"),
                      (dict(input_ids=[10 ** 9]), "input_ids"), (dict(prompt="x", pooling="max"), "pooling"),
                      (dict(input_ids=list(range(2000))), "input_ids")):
        with pytest.raises(ValueError, match=field):
            eng.encode(**kw)
    idle_ok(eng)


def test_mixed_with_generation_in_one_step(eng):
    """Embedding and generation requests in the same steps: the pooled rows and the logit
    rows (prompt logprobs, sampling) come out of one forward and change nothing."""
    kw = dict(input_ids=[[5, 6, 7, 8, 9, 10], [11, 12, 13]], sampling_params={"max_new_tokens": 6, "temperature": 0},
              return_logprob=True, logprob_start_len=0)
    eng.flush_cache()
    alone, vec = eng.generate(**kw), eng.encode(TEXTS, pooling="mean")
    eng.flush_cache()
    fut, _, _ = eng.submit(**kw)  # queued first: the encode call below steps both together
    mixed_vec = eng.encode(TEXTS, pooling="mean")
    mixed = fut.result(60)
    assert [o["output_ids"] for o in mixed] == [o["output_ids"] for o in alone]
    for a, b in zip(mixed, alone):
        got, ref = a["meta_info"]["input_token_logprobs"], b["meta_info"]["input_token_logprobs"]
        assert got[0][0] is None and np.allclose([t[0] for t in got[1:]], [t[0] for t in ref[1:]], atol=1e-5)
    assert all(close(a["embedding"], b["embedding"]) for a, b in zip(mixed_vec, vec))
    idle_ok(eng)


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_retracted_mid_prompt_starts_over(eng, pooling):
    """A request retracted between two chunks (its computed prefix stays cached) gives the
    same vector when re-admitted: "mean" computes the prompt again from position 0."""
    from radixserve.embedding import finalize
    from radixserve.scheduler.build import new_req
    from radixserve.scheduler.pooling import embedding_of

    ids = list(range(300, 340))  # 40 tokens: chunks of 16, 16, 8
    eng.flush_cache()
    ref = eng.encode(input_ids=ids, pooling=pooling)["embedding"]
    eng.flush_cache()

    def scenario(s):
        req = new_req(eng.builder.build_embed([ids], ["input_ids"], pooling)[0])
        s.add_request(req)
        s.step()
        assert 0 < req.kv_len < len(ids) and req.pooled is not None or pooling == "last"
        s._retract(req)
        s.check_invariants()
        while s.has_work():
            s.step()
        return embedding_of(req)

    vec = eng.run_on_driver(scenario, 60)
    assert close(finalize(vec), ref)
    idle_ok(eng)


# ---------------------------------------------------------------- the server
def server_idle_ok(server) -> None:
    s = server.wait_idle()["scheduler"]
    assert s["invariants_ok"], s["invariant_error"]
    assert s["held_slots"] == 0, s


def test_server_matches_engine_openai_and_float(server, eng):
    oai = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)
    r = oai.embeddings.create(model="m", input=TEXTS)  # the client asks for base64 and decodes it
    assert [d.index for d in r.data] == [0, 1, 2] and r.model == "m"
    ids = [eng.tokenizer.encode(t) for t in TEXTS]
    assert r.usage.prompt_tokens == r.usage.total_tokens == sum(len(i) for i in ids)
    ref = eng.encode(TEXTS)
    assert all(close(d.embedding, e["embedding"]) for d, e in zip(r.data, ref))
    with server.client() as http:
        body = http.post("/v1/embeddings", json={"input": ids[1], "encoding_format": "float",
                                                 "dimensions": 64, "user": "u"}).raise_for_status().json()
        assert body["object"] == "list" and body["data"][0]["object"] == "embedding"
        assert close(body["data"][0]["embedding"], ref[1]["embedding"])
        one_by_one = [http.post("/v1/embeddings", json={"input": t}).json()["data"][0]["embedding"] for t in TEXTS]
        assert all(close(a, e["embedding"]) for a, e in zip(one_by_one, ref))
        mean = http.post("/v1/embeddings", json={"input": ids, "pooling": "mean"}).json()["data"]
        ref_mean = eng.encode(input_ids=ids, pooling="mean")
        assert all(close(a["embedding"], e["embedding"]) for a, e in zip(mean, ref_mean))
        assert not close(mean[0]["embedding"], ref[0]["embedding"])
    server_idle_ok(server)


@pytest.mark.parametrize("body,field", [
    ({"input": ""}, "input"), ({"input": []}, "input"), ({"input": ["ok", ""]}, "input.1"),
    ({"input": [[1, 2], [3, "x"]]}, "input.1"), ({"input": {"a": 1}}, "input"), ({"input": [1.5]}, "input.0"),
    ({"input": [1, 10 ** 9]}, "input"), ({"input": list(range(9000))}, "input"), ({}, "input"),
    ({"input": "x", "dimensions": 8}, "dimensions"), ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "x", "pooling": "max"}, "pooling"),
])
def test_server_bad_input(server, body, field):
    with server.client() as http:
        r = http.post("/v1/embeddings", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"].startswith(field + ":"), r.text


def test_server_idle_after_bad_input(server):
    server_idle_ok(server)
