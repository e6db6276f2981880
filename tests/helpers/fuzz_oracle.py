"""The fuzzer's oracle: what every answer of the server must look like, and the server's state.

``check_answer`` judges one response: never a 5xx; a 4xx is the error object whose message
starts with the field it names (one of ``fields`` when the sender knows what it broke); a
2xx for input that is certainly invalid is wrong; a JSON answer is strict JSON (no NaN);
an SSE stream ends with ``data: [DONE]`` and its error events are clean 4xx error objects.
``send`` runs one ``FuzzCase`` (streams read to the end).  ``check_server`` checks /health,
that every child process is alive, and once idle that no KV slot is held and the
allocator's invariants hold (``stats+check``).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Optional

import httpx

from tests.helpers.fuzz_cases import FuzzCase
from tests.helpers.server_harness import pid_alive


@dataclass
class Outcome:
    label: str
    route: str
    status: int
    failure: Optional[str] = None  # what the oracle found wrong, with the request
    seconds: float = 0.0


def _strict_json(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


def _check_error(obj: Any, fields: tuple[str, ...], where: str) -> Optional[str]:
    err = obj.get("error") if isinstance(obj, dict) else None
    msg = err.get("message") if isinstance(err, dict) else None
    if not isinstance(msg, str):
        return f"{where}: no error object: {str(obj)[:200]}"
    if err.get("code", 400) >= 500:
        return f"{where}: server error event: {msg[:300]}"
    head = msg.split(": ", 1)[0]
    if not head or " " in head or head == msg:
        return f"{where}: the message names no field: {msg[:200]}"
    if fields and not any(head == f or head.startswith(f + ".") for f in fields):
        return f"{where}: names {head!r}, expected one of {fields}: {msg[:200]}"
    return None


def check_sse(text: str) -> Optional[str]:
    """None when ``text`` is a clean SSE stream ending in [DONE]."""
    events = [line[6:] for line in text.split("\n") if line.startswith("data: ")]
    if not events or events[-1] != "[DONE]":
        return f"stream does not end with [DONE]: ...{text[-200:]!r}"
    for ev in events[:-1]:
        try:
            obj = _strict_json(ev)
        except ValueError as e:
            return f"stream event is not strict JSON ({e}): {ev[:200]}"
        if isinstance(obj, dict) and "error" in obj:
            bad = _check_error(obj, (), "stream error event")
            if bad:
                return bad
    return None


def check_answer(status: int, text: str, content_type: str, fields: tuple[str, ...] = (),
                 must_fail: bool = False) -> Optional[str]:
    """What is wrong with this answer (None: nothing)."""
    if status >= 500:
        return f"HTTP {status}: {text[:300]}"
    if status >= 400:
        if status == 499:
            return None  # client went away (never sent by the fuzzer)
        try:
            return _check_error(_strict_json(text), fields, f"HTTP {status}")
        except ValueError:
            return f"HTTP {status} without a JSON error object: {text[:200]}"
    if must_fail:
        return f"HTTP {status} for invalid input: {text[:200]}"
    if "text/event-stream" in content_type:
        return check_sse(text)
    if "application/json" in content_type:
        try:
            _strict_json(text)
        except ValueError as e:
            return f"HTTP {status}: not strict JSON ({e}): {text[:200]}"
    return None


def send(client: httpx.Client, case: FuzzCase, timeout: float = 120.0) -> Outcome:
    """Send ``case`` (reading a stream to its end) and judge the answer."""
    t0 = time.perf_counter()
    try:
        with client.stream(case.method, case.path, content=case.body, headers=case.headers, timeout=timeout) as r:
            text = r.read().decode("utf-8", "replace")
            ctype = r.headers.get("content-type", "")
            status = r.status_code
    except httpx.HTTPError as e:
        return Outcome(case.label, case.path, -1, f"{type(e).__name__}: {e} (body {case.body[:200]!r})")
    bad = check_answer(status, text, ctype, case.fields, case.must_fail)
    if bad is None and case.expect and status not in case.expect:
        bad = f"HTTP {status}, expected {' or '.join(map(str, case.expect))}: {text[:200]}"
    return Outcome(case.label, case.path, status, None if bad is None else f"{bad} (body {case.body[:300]!r})",
                   time.perf_counter() - t0)


def check_server(client: httpx.Client, pids: dict[str, int], idle: bool = False, timeout: float = 60.0) -> list[str]:
    """Problems with the server's state: /health, child processes, and (``idle``) KV slots."""
    problems = []
    try:
        h = client.get("/health", timeout=10)
        if h.status_code != 200:
            problems.append(f"/health answered {h.status_code}: {h.text[:200]}")
    except httpx.HTTPError as e:
        problems.append(f"/health failed: {e}")
    problems += [f"child process {name} ({pid}) is gone" for name, pid in pids.items() if not pid_alive(pid)]
    if idle and not problems:
        deadline = time.time() + timeout
        while True:
            info = client.get("/get_server_info", params={"check_invariants": True}, timeout=30).json()
            s = info["scheduler"]
            busy = s["running"] or s["waiting"] or info["in_flight_requests"]
            if not busy or time.time() > deadline:
                break
            time.sleep(0.2)
        if busy:
            problems.append(f"not idle after {timeout} s: {s}")
        if not s.get("invariants_ok"):
            problems.append(f"KV invariants broken: {s.get('invariant_error')}")
        if s.get("held_slots") != 0:
            problems.append(f"held_slots {s.get('held_slots')} after the run")
    return problems
