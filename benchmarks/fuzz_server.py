"""Fuzz the HTTP server: schemathesis over its /openapi.json plus hand-written nasty requests.

    python -m benchmarks.fuzz_server --requests 10000            # launches its own tiny-model server
    python -m benchmarks.fuzz_server --url http://127.0.0.1:30000 --requests 2000 --api-key sk-...

The oracle (tests/fuzz_oracle.py): no 5xx, every 4xx names the offending field, streams end
cleanly, /health answers and every child process lives throughout, and afterwards no KV slot
is held and the allocator's invariants hold.  Prints the count per route and generator, the
status histogram, the duration and every failure; exits 1 on any failure.  The server it
launches (tests/helpers/fuzz_setup.py) serves a tiny random Qwen 3 reasoner with SmolLM2's
tokenizer plus think tokens (``--reasoning-parser qwen3``), a LoRA adapter from the start and
adapter directories (good and broken) to load while serving, and the hierarchical cache, with
``FUZZ_SERVER_ARGS``: a short context keeps generated outputs short, and grammar compiles time
out after 5 s.  ``--model`` serves another model with ``FUZZ_SERVER_ARGS`` only (the LoRA and
reasoning cases then expect refusals).  ``--seed`` takes several seeds: one run each, one server.
"""
from __future__ import annotations

import argparse
import sys
import tempfile


from tests.helpers.fuzz_cases import FuzzContext
from tests.helpers.fuzz_runner import FUZZ_SERVER_ARGS, build_fuzz_setup, run_fuzz
from tests.helpers.server_harness import ServerHandle


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="fuzz this server instead of launching one (loopback only)")
    ap.add_argument("--api-key", help="the server's API key (sent as a Bearer token)")
    ap.add_argument("--model", help="model of the launched server (default: a tiny random Llama)")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--schema-share", type=float, default=0.4, help="share of schemathesis requests")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--seed", type=int, nargs="+", default=[0], help="one run per seed, on one server")
    ap.add_argument("--time-limit", type=float, default=None, help="seconds for the request phases (per seed)")
    args = ap.parse_args()
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    srv = None
    failed = False
    with tempfile.TemporaryDirectory(prefix="fuzz-model-") as tmp:
        url, ctx = args.url, FuzzContext()
        if url is None:
            if args.model:
                srv = ServerHandle(args.model, *FUZZ_SERVER_ARGS).wait_ready()
            else:
                from radixserve.model.loader import resolve_hf_dir

                setup = build_fuzz_setup(resolve_hf_dir(None), tmp)
                srv, ctx = ServerHandle(setup.model, *setup.args).wait_ready(), setup.ctx
            url = srv.url
        try:
            for seed in args.seed:
                print(f"=== seed {seed}", flush=True)
                report = run_fuzz(url, args.requests, seed, args.schema_share, args.concurrency, args.time_limit,
                                  headers, log=True, ctx=ctx)
                print(report.summary(), flush=True)
                failed = failed or bool(report.failures)
        finally:
            if srv is not None:
                srv.stop()
                print(f"server log: {srv.log_path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
