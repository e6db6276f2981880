"""A server of its own: --max-queued-requests answers 503 with Retry-After, and killing
the model worker brings the whole server down, non-zero, within 10 s, leaving no child."""
from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import httpx

from server_harness import ServerHandle, pid_alive


def burst(url: str, n: int) -> list[httpx.Response]:
    async def main():
        body = {"text": "count with me", "sampling_params": {"max_new_tokens": 40, "ignore_eos": True}}
        async with httpx.AsyncClient(base_url=url, timeout=120) as c:
            return await asyncio.gather(*(c.post("/generate", json=body) for _ in range(n)))

    return asyncio.run(main())


def test_queue_limit_and_worker_death(tiny_dir):
    srv = ServerHandle(tiny_dir, "--max-total-tokens", "4096", "--max-running-requests", "2",
                       "--max-queued-requests", "2").wait_ready()
    try:
        responses = burst(srv.url, 12)
        codes = sorted(r.status_code for r in responses)
        assert set(codes) == {200, 503} and codes.count(200) >= 2, codes  # >= the queue size
        rejected = next(r for r in responses if r.status_code == 503)
        assert rejected.headers.get("retry-after") and "queue" in rejected.json()["error"]["message"]
        assert all(r.json()["meta_info"]["completion_tokens"] == 40 for r in responses if r.status_code == 200)
        assert srv.wait_idle()["scheduler"]["held_slots"] == 0

        pids = srv.info()["pids"]
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
        os.kill(pids["worker"], signal.SIGKILL)
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
