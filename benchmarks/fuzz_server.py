"""Fuzz the HTTP server: schemathesis over its /openapi.json plus hand-written nasty requests.

    python -m benchmarks.fuzz_server --requests 10000            # launches its own tiny-model server
    python -m benchmarks.fuzz_server --url http://127.0.0.1:30000 --requests 2000 --api-key sk-...

The oracle (tests/fuzz_oracle.py): no 5xx, every 4xx names the offending field, streams end
cleanly, /health answers and every child process lives throughout, and afterwards no KV slot
is held and the allocator's invariants hold.  Prints the count per route and generator, the
status histogram, the duration and every failure; exits 1 on any failure.  The server it
launches serves a tiny random Llama with SmolLM2's tokenizer (``--model`` for another) with
``FUZZ_SERVER_ARGS``: a short context keeps generated outputs short, and grammar compiles
time out after 5 s.
"""
from __future__ import annotations

import argparse
import sys
import tempfile


from tests.helpers.fuzz_runner import FUZZ_SERVER_ARGS, run_fuzz
from tests.helpers.server_harness import ServerHandle


def tiny_model(tmp: str) -> str:
    from tests.helpers.models import build_tiny_llama
    from radixserve.model.loader import resolve_hf_dir

    return build_tiny_llama(resolve_hf_dir(None), tmp)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="fuzz this server instead of launching one (loopback only)")
    ap.add_argument("--api-key", help="the server's API key (sent as a Bearer token)")
    ap.add_argument("--model", help="model of the launched server (default: a tiny random Llama)")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--schema-share", type=float, default=0.4, help="share of schemathesis requests")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--time-limit", type=float, default=None, help="seconds for the request phases")
    args = ap.parse_args()
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    srv = None
    with tempfile.TemporaryDirectory(prefix="fuzz-model-") as tmp:
        url = args.url
        if url is None:
            srv = ServerHandle(args.model or tiny_model(tmp), *FUZZ_SERVER_ARGS).wait_ready()
            url = srv.url
        try:
            report = run_fuzz(url, args.requests, args.seed, args.schema_share, args.concurrency, args.time_limit,
                              headers, log=True)
        finally:
            if srv is not None:
                srv.stop()
                print(f"server log: {srv.log_path}")
    print(report.summary())
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
