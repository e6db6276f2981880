"""A server of its own: --max-queued-requests answers 503 with Retry-After (native and OpenAI
routes, streamed or not: before the stream starts), and killing
the process that holds the model (the scheduler, with one rank: ``worker/local.py``) brings the
whole server down, non-zero, within 10 s, leaving no child."""
from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import httpx

from tests.helpers.server_harness import ServerHandle, pid_alive


def burst(url: str, n: int, route: str = "/generate", stream: bool = False) -> list[httpx.Response]:
    """``n`` concurrent requests; a streamed one's response is read to the end (``.content``)."""
    if route == "/generate":
        body = {"text": "count with me", "sampling_params": {"max_new_tokens": 40, "ignore_eos": True}}
    elif route == "/v1/completions":
        body = {"model": "m", "prompt": "count with me", "max_tokens": 40, "ignore_eos": True}
    else:
        body = {"model": "m", "messages": [{"role": "user", "content": "count"}], "max_tokens": 40, "ignore_eos": True}
    body["stream"] = stream

    async def one(c: httpx.AsyncClient) -> httpx.Response:
        async with c.stream("POST", route, json=body) as r:
            await r.aread()
            return r

    async def main():
        async with httpx.AsyncClient(base_url=url, timeout=120) as c:
            return await asyncio.gather(*(one(c) for _ in range(n)))

    return asyncio.run(main())


def check_queue_full(responses: list[httpx.Response], stream: bool) -> None:
    """Some 503s with Retry-After naming the queue (before any stream starts), the rest served."""
    codes = sorted(r.status_code for r in responses)
    assert set(codes) == {200, 503} and codes.count(200) >= 2, codes  # >= the queue size
    for r in responses:
        if r.status_code == 503:
            assert r.headers.get("retry-after") and "queue" in r.json()["error"]["message"], r.text
        elif stream:
            assert r.text.rstrip().endswith("data: [DONE]") and '"error"' not in r.text, r.text[-300:]


def test_queue_limit_and_worker_death(tiny_dir):
    srv = ServerHandle(tiny_dir, "--max-total-tokens", "4096", "--max-running-requests", "2",
                       "--max-queued-requests", "2").wait_ready()
    try:
        responses = burst(srv.url, 12)
        check_queue_full(responses, stream=False)
        assert all(r.json()["meta_info"]["completion_tokens"] == 40 for r in responses if r.status_code == 200)
        # the OpenAI routes and streamed requests get the same 503 before their stream starts
        for route, stream in (("/generate", True), ("/v1/completions", False), ("/v1/completions", True),
                              ("/v1/chat/completions", False), ("/v1/chat/completions", True)):
            check_queue_full(burst(srv.url, 12, route, stream), stream)
        assert srv.wait_idle()["scheduler"]["held_slots"] == 0

        pids = srv.info()["pids"]
        assert "worker" not in pids  # one rank: the model runs in the scheduler process
        in_flight: dict = {}

        def long_stream() -> None:
            body = {"text": "go", "sampling_params": {"max_new_tokens": 900, "ignore_eos": True}, "stream": True}
            try:
                with httpx.stream("POST", srv.url + "/generate", json=body, timeout=30) as r:
                    in_flight["lines"] = list(r.iter_lines())
            except httpx.HTTPError as e:
                in_flight["error"] = e

        t = threading.Thread(target=long_stream)
        t.start()
        time.sleep(1.0)
        os.kill(pids["scheduler"], signal.SIGKILL)
        t0 = time.time()
        health_failed = False
        while time.time() - t0 < 10 and srv.proc.poll() is None:
            try:
                health_failed |= httpx.get(srv.url + "/health", timeout=1).status_code != 200
            except httpx.HTTPError:
                health_failed = True
            time.sleep(0.1)
        rc = srv.proc.wait(timeout=max(0.1, 10 - (time.time() - t0)))
        assert time.time() - t0 < 10 and rc != 0 and health_failed
        t.join(10)
        assert not t.is_alive(), "the in-flight request hung"
        assert "error" in in_flight or any("error" in line for line in in_flight.get("lines", []))
        for name, pid in pids.items():
            assert not pid_alive(pid), f"{name} (pid {pid}) left behind"
    finally:
        srv.stop()
