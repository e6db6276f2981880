"""The server fuzzer, short: >= 1,000 generated requests (schemathesis over /openapi.json and
the hand-written nasty cases of tests/helpers/fuzz_cases.py and fuzz_routes.py) against a server of
its own with every wave-3 feature on (tests/helpers/fuzz_setup.py: a reasoning model, LoRA with
adapters to load, the hierarchical cache).  The oracle: no 5xx, every 4xx names the offending
field, streams end cleanly, the server stays healthy with every child alive, and afterwards no KV
slot is held and the invariants hold.  The long run (>= 10,000 requests) is
``benchmarks/fuzz_server.py``."""
from __future__ import annotations

import pytest

from tests.helpers.fuzz_runner import build_fuzz_setup, run_fuzz
from tests.helpers.server_harness import ServerHandle

REQUESTS = 1000


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory, smol_dir):
    setup = build_fuzz_setup(smol_dir, str(tmp_path_factory.mktemp("fuzz")))
    srv = ServerHandle(setup.model, *setup.args).wait_ready()
    yield srv, setup.ctx
    srv.stop()


@pytest.mark.timeout(600)
def test_fuzz_server(fuzz_server):
    srv, ctx = fuzz_server
    report = run_fuzz(srv.url, REQUESTS, seed=15, schema_share=0.5, time_limit=400, ctx=ctx)
    print(report.summary())
    assert not report.failures, report.summary()
    assert len(report.outcomes) >= REQUESTS, report.summary()
    labels = {o.label.split(":")[0] for o in report.outcomes}  # every generator ran
    assert {"unknown_field", "model", "lora", "lora_admin", "documents", "responses", "reasoning",
            "constraint_budget", "get"} <= labels, sorted(labels)
    assert srv.proc.poll() is None
