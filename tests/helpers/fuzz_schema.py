"""The schemathesis half of the server fuzzer: requests generated from the server's own
/openapi.json (every operation it lists, positive and negative data).

Each answer goes through schemathesis' checks (no 5xx, status code and content type
declared, response body conforms to its schema, negative data rejected) and through the
fuzzer's own oracle (``fuzz_oracle.check_answer``: a 4xx names a field, streams end cleanly).
"""
from __future__ import annotations

import time
from typing import Any, Callable, Optional

import httpx
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (content_type_conformance, negative_data_rejection,
                                               response_schema_conformance, status_code_conformance)

from tests.helpers.fuzz_oracle import Outcome, check_answer

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          negative_data_rejection]
# operations that would disturb the run itself: aborting everyone's requests
SKIP = {"POST /abort_request"}


def load_schema(url: str, headers: dict[str, str]) -> Any:
    """The server's OpenAPI document as a schemathesis schema (fails if the document is invalid)."""
    doc = httpx.get(url + "/openapi.json", headers=headers, timeout=30).raise_for_status().json()
    return schemathesis.openapi.from_dict(doc)


def operations(schema: Any) -> list[Any]:
    """Every operation of the document, bar ``SKIP``; a broken operation raises."""
    ops = [r.ok() for r in schema.get_all_operations()]
    return [op for op in ops if op.label not in SKIP]


def _first_line(e: BaseException) -> str:
    if isinstance(e, BaseExceptionGroup):
        return "; ".join(_first_line(x) for x in e.exceptions)[:600]
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"[:300]


def run_schema_cases(url: str, budget: int, rng_seed: int, headers: Optional[dict[str, str]] = None,
                     deadline: Optional[float] = None, on_outcome: Callable[[Outcome], None] = lambda o: None
                     ) -> list[Outcome]:
    """About ``budget`` generated requests spread over the operations, half positive and half
    negative data (operations without inputs yield fewer); stops at ``deadline`` (time.time())."""
    headers = headers or {}
    schema = load_schema(url, headers)
    ops = operations(schema)
    outcomes: list[Outcome] = []
    session = requests.Session()
    for rnd in range(100):  # hypothesis stops early on small input spaces: more rounds, new seeds
        left = budget - len(outcomes)
        if left <= 0 or (deadline is not None and time.time() > deadline):
            break
        _round(url, ops, max(1, left // (2 * len(ops))), rng_seed + rnd, headers, session, deadline, outcomes,
               on_outcome)
    return outcomes


def _round(url: str, ops: list[Any], per: int, rng_seed: int, headers: dict[str, str], session: Any,
           deadline: Optional[float], outcomes: list[Outcome], on_outcome: Callable[[Outcome], None]) -> None:
    """Up to ``per`` positive and ``per`` negative cases of every operation."""
    for op in ops:
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):
            if deadline is not None and time.time() > deadline:
                return

            @seed(rng_seed)
            @settings(max_examples=per, database=None, deadline=None, phases=[Phase.generate],
                      suppress_health_check=list(HealthCheck), derandomize=False)
            @given(case=op.as_strategy(generation_mode=mode))
            def one(case: Any) -> None:
                if deadline is not None and time.time() > deadline:
                    return
                label = f"schema:{mode.value}"
                t0 = time.perf_counter()
                try:
                    resp = case.call(base_url=url, headers=headers, session=session, timeout=120)
                except Exception as e:  # the connection itself failed: the server dropped it
                    outcome = Outcome(label, op.label, -1, f"{_first_line(e)} ({case.as_curl_command()[:400]})")
                else:
                    failure = check_answer(resp.status_code, resp.text, resp.headers.get("content-type", ""))
                    try:
                        case.validate_response(resp, checks=CHECKS, headers=headers)
                    except (Exception, BaseExceptionGroup) as e:
                        failure = failure or _first_line(e)
                    if failure:
                        failure = f"{failure} ({case.as_curl_command()[:400]})"
                    outcome = Outcome(label, op.label, resp.status_code, failure, time.perf_counter() - t0)
                outcomes.append(outcome)
                on_outcome(outcome)

            try:
                one()
            except Unsatisfiable:  # negative data for an operation that takes no input
                pass
