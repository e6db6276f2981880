"""Run one soak request and classify what came back.

Outcomes (``Outcome.kind``):
  ok            a complete answer: 200 JSON with the expected shape, or a stream ending [DONE]
  aborted       the client aborted it (/abort_request) and got its answer (finish "abort" or done)
  disconnected  the client closed the stream on purpose mid-way
  rejected      an oversize request refused with a 400 that names the KV pool
  queue_full    503 with a Retry-After header (the waiting queue is full)
  server_down   a clean error because the server was down: a 5xx / SSE error event naming the
                dead process, or a connection refused/closed before any response while the
                fault injector had the server down (between the kill and the restart's health)
  other_error   any other clean error (status + error body, or an SSE error event)
  wrong         a complete answer that is wrong (an oversize request accepted, n answers missing)
  lost          no answer and no error within the deadline, a stream cut without an error
                event or [DONE], a connection error while the server was up, or a malformed body
A soak passes only with zero ``lost`` and zero ``wrong``.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any, Callable

import httpx

from benchmarks.soak_mix import Spec

CLEAN = ("ok", "aborted", "disconnected", "rejected", "queue_full", "server_down", "other_error")


@dataclass
class Outcome:
    kind: str
    detail: str = ""
    status: int = 0


def _expected_n(spec: Spec) -> int:
    p = spec.payload
    return int(p.get("n") or p.get("sampling_params", {}).get("n") or 1)


def _classify_error(spec: Spec, status: int, message: str, headers: httpx.Headers) -> Outcome:
    if spec.oversize and status == 400 and "KV pool" in message:
        return Outcome("rejected", message[:120], status)
    if status == 503 and "queue" in message:
        if not headers.get("retry-after"):
            return Outcome("wrong", "503 queue full without Retry-After", status)
        return Outcome("queue_full", "", status)
    if status >= 500 and ("process exited" in message or "unhealthy" in message):
        return Outcome("server_down", message[:120], status)
    return Outcome("other_error", f"{status}: {message[:160]}", status)


def _error_message(raw: bytes) -> str:
    try:
        body = json.loads(raw)
        return str(body["error"]["message"]) if isinstance(body, dict) and "error" in body else str(body)
    except (ValueError, KeyError, TypeError):
        return raw[:200].decode(errors="replace")


def _check_json(spec: Spec, body: Any) -> Outcome:
    n = _expected_n(spec)
    if spec.oversize:
        return Outcome("wrong", "oversize request accepted", 200)
    if spec.route == "/generate":
        items = body if isinstance(body, list) else [body]
        if len(items) != n or not all("meta_info" in it and "text" in it for it in items):
            return Outcome("wrong", f"expected {n} native results", 200)
        reasons = {(it["meta_info"].get("finish_reason") or {}).get("type") for it in items}
        if spec.action == "abort" and "abort" in reasons:
            return Outcome("aborted", "", 200)
        if spec.kind == "choices" and not all(it["text"] in ("red", "green", "blue") or
                                              (it["meta_info"].get("finish_reason") or {}).get("type") != "stop"
                                              for it in items):
            return Outcome("wrong", f"choices answered {[it['text'] for it in items]}", 200)
        return Outcome("ok", "", 200)
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or sorted(c.get("index") for c in choices) != list(range(n)):
        return Outcome("wrong", f"expected {n} choices", 200)
    return Outcome("ok", "", 200)


async def _read_stream(spec: Spec, resp: httpx.Response) -> Outcome:
    chunks = 0
    async for line in resp.aiter_lines():
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            if spec.oversize:
                return Outcome("wrong", "oversize request streamed", 200)
            return Outcome("aborted" if spec.action == "abort" else "ok", "", 200)
        try:
            obj = json.loads(data)
        except ValueError:
            return Outcome("lost", f"malformed SSE chunk {data[:80]!r}", 200)
        if isinstance(obj, dict) and "error" in obj:
            err = obj["error"]
            msg = str(err.get("message", err))
            out = _classify_error(spec, int(err.get("code") or 500), msg, httpx.Headers({"retry-after": "1"}))
            return out if out.kind != "rejected" else Outcome("other_error", msg[:160], 200)
        chunks += 1
        if spec.action == "disconnect" and chunks >= spec.chunks:
            return Outcome("disconnected", "", 200)  # leaving the block closes the connection
        if spec.action == "slow":
            await asyncio.sleep(spec.delay)
    return Outcome("lost", f"stream cut after {chunks} chunks without an error event or [DONE]", 200)


async def _send(client: httpx.AsyncClient, base: str, spec: Spec, pool: int) -> Outcome:
    body = spec.body(pool)
    if spec.stream:
        async with client.stream("POST", base + spec.route, json=body) as resp:
            if resp.status_code != 200:
                raw = await resp.aread()
                return _classify_error(spec, resp.status_code, _error_message(raw), resp.headers)
            return await _read_stream(spec, resp)
    resp = await client.post(base + spec.route, json=body)
    if resp.status_code != 200:
        return _classify_error(spec, resp.status_code, _error_message(resp.content), resp.headers)
    try:
        return _check_json(spec, resp.json())
    except ValueError:
        return Outcome("lost", f"malformed JSON body {resp.text[:80]!r}", 200)


async def _abort_later(client: httpx.AsyncClient, base: str, spec: Spec) -> None:
    await asyncio.sleep(spec.delay)
    try:
        await client.post(base + "/abort_request", json={"rid": spec.rid}, timeout=10)
    except httpx.HTTPError:
        pass  # the server may be down: the request itself reports that


async def run_request(client: httpx.AsyncClient, base: str, spec: Spec, pool: int, deadline_s: float,
                      was_down: Callable[[float, float], bool]) -> Outcome:
    """Send ``spec`` to the server at ``base`` and classify the result; never raises and
    never outlives ``deadline_s``.
    ``was_down(t0, t1)`` tells whether the server was (being) taken down between t0 and t1."""
    t0 = time.monotonic()
    aborter = asyncio.create_task(_abort_later(client, base, spec)) if spec.action == "abort" else None
    try:
        return await asyncio.wait_for(_send(client, base, spec, pool), deadline_s)
    except asyncio.TimeoutError:
        return Outcome("lost", f"no answer within {deadline_s:.0f} s")
    except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as e:
        if was_down(t0, time.monotonic()):
            return Outcome("server_down", f"{type(e).__name__}")
        return Outcome("lost", f"{type(e).__name__} while the server was up: {e}")
    except Exception as e:  # noqa: BLE001 -- anything else is a lost request, with its reason
        return Outcome("lost", f"{type(e).__name__}: {e}")
    finally:
        if aborter is not None:
            aborter.cancel()
