"""The server fuzzer, short: >= 1,000 generated requests (schemathesis over /openapi.json and
the hand-written nasty cases of tests/fuzz_cases.py) against a server of its own.  The
oracle: no 5xx, every 4xx names the offending field, streams end cleanly, the server stays
healthy with every child alive, and afterwards no KV slot is held and the invariants hold.
The long run (>= 10,000 requests) is ``benchmarks/fuzz_server.py``."""
from __future__ import annotations

import pytest

from tests.helpers.fuzz_runner import FUZZ_SERVER_ARGS, run_fuzz
from tests.helpers.server_harness import ServerHandle

REQUESTS = 1000


@pytest.fixture(scope="module")
def fuzz_server(tiny_dir):
    srv = ServerHandle(tiny_dir, *FUZZ_SERVER_ARGS).wait_ready()
    yield srv
    srv.stop()


@pytest.mark.timeout(600)
def test_fuzz_server(fuzz_server):
    report = run_fuzz(fuzz_server.url, REQUESTS, seed=15, schema_share=0.5, time_limit=400)
    print(report.summary())
    assert not report.failures, report.summary()
    assert len(report.outcomes) >= REQUESTS, report.summary()
    assert fuzz_server.proc.poll() is None
