"""Run the server fuzzer: schemathesis over /openapi.json, then the hand-written nasty cases.

``run_fuzz(url, total)`` sends about ``total`` requests (``schema_share`` of them generated
from the OpenAPI document, the rest from ``fuzz_cases``, ``concurrency`` at a time), checks
/health and the child processes every ``check_every`` requests, and at the end, once idle,
that no KV slot is held and the allocator's invariants hold.  ``FuzzReport.failures`` lists
everything the oracle found; an empty list is a pass.
"""
from __future__ import annotations

import random
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Optional

import httpx

from tests.helpers.fuzz_cases import FuzzContext
from tests.helpers.fuzz_oracle import Outcome, check_server, send
from tests.helpers.fuzz_routes import nasty_case, regression_cases
from tests.helpers.fuzz_schema import run_schema_cases
from tests.helpers.fuzz_setup import FUZZ_SERVER_ARGS, FuzzSetup, build_fuzz_setup  # noqa: F401 (for the callers)


@dataclass
class FuzzReport:
    outcomes: list[Outcome] = field(default_factory=list)
    server_problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failures(self) -> list[str]:
        return [f"{o.route} [{o.label}]: {o.failure}" for o in self.outcomes if o.failure] + self.server_problems

    def summary(self) -> str:
        """Counts per route and generator, the status histogram and the failures."""
        lines = [f"{len(self.outcomes)} requests in {self.seconds:.1f} s, {len(self.failures)} failures"]
        by_source = Counter("schemathesis" if o.label.startswith("schema:") else "hand-written" for o in self.outcomes)
        lines.append("by source: " + ", ".join(f"{k} {v}" for k, v in sorted(by_source.items())))
        lines.append("status histogram: " + ", ".join(f"{k}: {v}" for k, v in
                                                     sorted(Counter(o.status for o in self.outcomes).items())))
        lines.append("per route:")
        for route, n in sorted(Counter(o.route.split(" ")[-1] for o in self.outcomes).items()):
            lines.append(f"  {route:32s} {n}")
        lines.append("per generator:")
        secs: Counter = Counter()
        for o in self.outcomes:
            secs[o.label.split(":")[0]] += o.seconds
        for label, n in sorted(Counter(o.label.split(":")[0] for o in self.outcomes).items()):
            lines.append(f"  {label:32s} {n:6d}  {secs[label]:8.1f} s")
        lines += [f"FAIL {f}" for f in self.failures[:50]]
        return "\n".join(lines)


def run_fuzz(url: str, total: int, seed: int = 0, schema_share: float = 0.4, concurrency: int = 4,
             time_limit: Optional[float] = None, headers: Optional[dict[str, str]] = None,
             check_every: int = 250, log: bool = False, ctx: Optional[FuzzContext] = None) -> FuzzReport:
    """Fuzz the server at ``url``; see the module docstring.  ``time_limit`` (seconds) bounds
    the request phases (the final idle check has its own 60 s bound).  ``ctx``: what the cases may
    know of the server (``fuzz_setup.build_fuzz_setup``'s; its model names and a few stored
    responses are added here)."""
    headers = headers or {}
    t0 = time.time()
    deadline = None if time_limit is None else t0 + time_limit
    report = FuzzReport()
    ctx = ctx or FuzzContext()
    with httpx.Client(base_url=url, headers=headers, timeout=120) as client:
        info = client.get("/get_server_info", timeout=30).json()
        pids = info.get("pids", {})
        ctx.served_names = [info["served_model_name"]] if info.get("served_model_name") else []
        for i in range(8):  # an earlier run's adapters out (the regression loads must not meet --max-loaded-loras)
            client.post("/unload_lora_adapter", json={"lora_name": f"fz-{i}"}, timeout=60)
        for _ in range(3):  # stored responses for previous_response_id
            r = client.post("/v1/responses", json={"input": "Hello", "max_output_tokens": 2}, timeout=60)
            if r.status_code == 200:
                ctx.response_ids.append(r.json()["id"])
        on_outcome = (lambda o: o.failure and print(f"FAIL {o.route} [{o.label}]: {o.failure[:500]}", flush=True)) \
            if log else (lambda o: None)
        report.outcomes += run_schema_cases(url, int(total * schema_share), seed, headers, deadline, on_outcome)
        report.server_problems += check_server(client, pids)
        if log:
            print(f"schemathesis: {len(report.outcomes)} requests, {time.time() - t0:.1f} s", flush=True)
        rng = random.Random(seed)
        remaining = total - len(report.outcomes)
        fixed = regression_cases(ctx)  # first, once: the inputs that once broke the server
        with ThreadPoolExecutor(concurrency) as pool:
            while remaining > 0 and not report.server_problems:
                if deadline is not None and time.time() > deadline:
                    break
                batch, fixed = fixed[:check_every], fixed[check_every:]
                batch += [nasty_case(rng, ctx) for _ in range(min(check_every, remaining) - len(batch))]
                outs = list(pool.map(lambda c: send(client, c), batch))
                report.outcomes += outs
                if log:
                    for o in outs:
                        if o.failure:
                            print(f"FAIL {o.route} [{o.label}]: {o.failure[:500]}", flush=True)
                remaining -= len(batch)
                report.server_problems += check_server(client, pids)
                if log:
                    print(f"{len(report.outcomes)} requests, {time.time() - t0:.1f} s, "
                          f"{len(report.failures)} failures", flush=True)
        if not report.server_problems:
            report.server_problems += check_server(client, pids, idle=True)
    report.seconds = time.time() - t0
    return report
