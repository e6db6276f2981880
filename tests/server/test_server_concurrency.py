"""64 concurrent mixed requests against the real server: streaming and not, batched, n > 1,
aborted through /abort_request, and clients that disconnect midway.  Every request must
end correctly and afterwards no KV slot may be held outside the radix cache."""
from __future__ import annotations

import asyncio
import json
import random
import time

import httpx
import pytest

from tests.helpers.server_harness import shared_server

LONG = {"max_new_tokens": 900, "ignore_eos": True, "temperature": 0.8}


@pytest.fixture(scope="session")
def server(tiny_dir):
    return shared_server(tiny_dir)


async def read_stream(lines, stop_after: int | None = None) -> list[dict]:
    """SSE chunks from an ``aiter_lines()`` iterator (it may be read again after stop_after)."""
    chunks = []
    async for line in lines:
        if not line:
            continue
        if line == "data: [DONE]":
            return chunks
        chunks.append(json.loads(line[6:]))
        if stop_after is not None and len(chunks) >= stop_after:
            return chunks
    raise AssertionError("stream ended without [DONE]")


async def one(c: httpx.AsyncClient, i: int, rng: random.Random) -> str:
    kind = i % 8
    words = ["alpha", "beta", "gamma", "delta"]
    prompt = f"request {i}: " + " ".join(rng.choice(words) for _ in range(rng.randrange(3, 40)))
    n_tok = rng.randrange(1, 40)
    sp = {"max_new_tokens": n_tok, "temperature": 0, "ignore_eos": True}
    if kind == 0:  # plain
        out = (await c.post("/generate", json={"text": prompt, "sampling_params": sp})).json()
        assert out["meta_info"]["finish_reason"] == {"type": "length", "length": n_tok}
        assert len(out["output_ids"]) == n_tok
    elif kind == 1:  # streaming
        async with c.stream("POST", "/generate", json={"text": prompt, "sampling_params": sp, "stream": True}) as r:
            chunks = await read_stream(r.aiter_lines())
        assert chunks[-1]["meta_info"]["completion_tokens"] == n_tok
    elif kind == 2:  # batched
        out = (await c.post("/generate", json={"text": [prompt, prompt + " more"], "sampling_params": sp})).json()
        assert len(out) == 2 and all(len(o["output_ids"]) == n_tok for o in out)
    elif kind == 3:  # n > 1, sampled
        body = {"text": prompt, "sampling_params": {**sp, "temperature": 1.0, "n": 3, "seed": i}}
        out = (await c.post("/generate", json=body)).json()
        assert len(out) == 3 and all(o["meta_info"]["finish_reason"]["type"] == "length" for o in out)
    elif kind == 4:  # aborted through /abort_request once it streams
        rid = f"abort-me-{i}"
        body = {"text": prompt, "sampling_params": LONG, "stream": True, "rid": rid}
        async with c.stream("POST", "/generate", json=body) as r:
            lines = r.aiter_lines()
            first = await read_stream(lines, stop_after=1)
            assert (await c.post("/abort_request", json={"rid": rid})).json()["aborted"] == 1
            rest = await read_stream(lines)
        last = (first + rest)[-1]
        assert last["meta_info"]["finish_reason"]["type"] == "abort"
        return "aborted"
    elif kind == 5:  # streaming client disconnects midway
        async with c.stream("POST", "/generate", json={"text": prompt, "sampling_params": LONG, "stream": True}) as r:
            await read_stream(r.aiter_lines(), stop_after=2)
        return "disconnected"
    elif kind == 6:  # non-streaming client gives up (timeout) midway
        try:
            await c.post("/generate", json={"text": prompt, "sampling_params": LONG}, timeout=1.5)
        except httpx.TimeoutException:
            return "disconnected"
        raise AssertionError("a 900-token request finished within 1.5 s")
    else:  # n > 1 streaming
        body = {"text": prompt, "sampling_params": {**sp, "n": 2}, "stream": True}
        async with c.stream("POST", "/generate", json=body) as r:
            chunks = await read_stream(r.aiter_lines())
        finals = [ch for ch in chunks if ch["meta_info"]["finish_reason"]]
        assert sorted(ch["index"] for ch in finals) == [0, 1]
    return "ok"


def aborted_total(server) -> float:
    with server.client() as c:
        for line in c.get("/metrics").text.splitlines():
            if line.startswith("radixserve:aborted_requests_total"):
                return float(line.split()[-1])
    raise AssertionError("no abort counter")


def test_64_concurrent_mixed_requests(server):
    aborts_before = aborted_total(server)

    async def main():
        rng = random.Random(0)
        limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
        async with httpx.AsyncClient(base_url=server.url, headers=server.headers, timeout=120, limits=limits) as c:
            return await asyncio.gather(*(one(c, i, rng) for i in range(64)))

    results = asyncio.run(main())
    assert results.count("ok") == 40 and results.count("aborted") == 8 and results.count("disconnected") == 16
    info = server.wait_idle()
    s = info["scheduler"]
    assert s["running"] == 0 and s["waiting"] == 0 and info["in_flight_requests"] == 0
    assert s["held_slots"] == 0 and s["protected_size"] == 0, s
    assert s["invariants_ok"], s["invariant_error"]
    # the disconnected requests were aborted, not run to their 900 tokens
    # the abort counter lives in the server process and is bumped when each abort's final
    # output arrives there, which may trail the scheduler going idle
    deadline = time.time() + 30
    while aborted_total(server) - aborts_before < 24 and time.time() < deadline:
        time.sleep(0.2)
    assert aborted_total(server) - aborts_before == 24
