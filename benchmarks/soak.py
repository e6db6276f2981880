"""Soak test with faults: a seeded mixed request stream against a real server on 127.0.0.1
while a fault injector stalls the detokenizer, kills the model worker once and fills memory.

Phases, in order (the request count is split 5% / 45% / 25% / 25%):
  warm-up    no faults; then the server's process-tree RSS is the baseline
  stalls     the detokenizer is SIGSTOPped for ``--stall-s`` seconds ``--stalls`` times
  kill       after a third of the phase, the worker is SIGKILLed: the server must exit
             non-zero by itself; the supervisor (this script) restarts it and waits for
             /health_generate, and the remaining requests go to the new server
  pressure   the supervisor restarts the server with a tiny KV pool (``--pressure-tokens``)
             and a bounded queue (``--pressure-queue``): admission, retraction, 503s
After each phase (before any restart) the server is drained and checked: ``held_slots == 0``
and the allocator's invariants (``/get_server_info?check_invariants=true``).  Outcomes are
defined in soak_client.py; the run passes with zero lost, zero wrong, no leaked slot,
invariants OK, a server that exited non-zero after the kill and came back healthy, and (with
``--rss-bound-pct``) RSS growth of the first server within the bound.  Retractions under
pressure are reported, not required: whether the pool runs dry during decode depends on the
outputs' lengths (tests/server/test_memory_pressure.py forces them).
Every request has a deadline and the whole run stops by itself after ``--max-minutes``.

    flock /tmp/rs-heavy.lock python -m benchmarks.soak --requests 2000 --concurrency 32
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time
from collections import Counter
from typing import Any, Callable, Optional

import httpx

from benchmarks.soak_client import Outcome, run_request
from benchmarks.soak_faults import Supervisor, kill_worker, stall_detokenizer
from benchmarks.soak_mix import Spec, make_mix


def check_server(sup: Supervisor) -> dict[str, Any]:
    """Drain, then the scheduler's stats with a full invariant check."""
    assert sup.handle is not None
    sup.handle.wait_idle(120)
    with sup.handle.client(timeout=120) as c:
        s = c.get("/get_server_info", params={"check_invariants": "true"}).raise_for_status().json()["scheduler"]
    return {"held_slots": s["held_slots"], "invariants_ok": s["invariants_ok"],
            "invariant_error": s["invariant_error"], "retractions": s["retractions"]}


async def run_specs(sup: Supervisor, specs: list[Spec], concurrency: int, deadline_s: float, end_by: float,
                    on_done: Optional[Callable[[int], None]] = None) -> list[tuple[Spec, Outcome]]:
    """Send ``specs`` with ``concurrency`` clients; a client waits while the server is down and
    takes no new request after ``end_by`` (monotonic)."""
    it = iter(specs)
    results: list[tuple[Spec, Outcome]] = []
    limits = httpx.Limits(max_connections=2 * concurrency + 8, max_keepalive_connections=2 * concurrency)
    async with httpx.AsyncClient(timeout=httpx.Timeout(deadline_s, connect=5), limits=limits) as client:
        async def client_loop() -> None:
            while True:
                while sup.is_down() and time.monotonic() < end_by:
                    await asyncio.sleep(0.2)
                spec = next(it, None)
                if spec is None or time.monotonic() >= end_by:
                    return
                out = await run_request(client, sup.url, spec, sup.kv_capacity, deadline_s, sup.was_down)
                results.append((spec, out))
                if on_done is not None:
                    on_done(len(results))

        await asyncio.gather(*(client_loop() for _ in range(concurrency)))
    return results


def phase(name: str, results: list[tuple[Spec, Outcome]], wanted: int, **extra: Any) -> dict[str, Any]:
    counts = Counter(o.kind for _, o in results)
    print(f"[soak {time.strftime('%H:%M:%S')}] phase {name}: {dict(counts)} {extra}", file=sys.stderr, flush=True)
    counts["not_run"] = wanted - len(results)
    bad = [f"#{s.idx} {s.kind} {s.route}{' stream' if s.stream else ''}: {o.kind}: {o.detail}"
           for s, o in results if o.kind in ("lost", "wrong", "other_error")]
    return {"phase": name, "requests": len(results), "counts": dict(counts), "examples": bad[:10], **extra}


def run_soak(args: argparse.Namespace) -> dict[str, Any]:
    """Run every phase; returns the JSON summary (``summary["pass"]``)."""
    model = args.model
    if model is None:
        from radixserve.model.loader import resolve_hf_dir
        model = resolve_hf_dir(None)
    flags = ["--max-total-tokens", str(args.max_total_tokens), *args.server_args]
    specs = make_mix(args.seed, args.requests)
    n_warm = max(1, args.requests // 20)
    n_stall = args.requests * 45 // 100
    n_kill = args.requests // 4
    cuts = [0, n_warm, n_warm + n_stall, n_warm + n_stall + n_kill, args.requests]
    part = [specs[a:b] for a, b in zip(cuts, cuts[1:])]
    t_start = time.monotonic()
    end_by = t_start + args.max_minutes * 60
    log: list[str] = []
    phases: list[dict[str, Any]] = []
    sup = Supervisor(model, flags)
    run = lambda chunk, **kw: asyncio.run(run_specs(sup, chunk, args.concurrency, args.deadline_s, end_by, **kw))
    try:
        sup.start()
        phases.append(phase("warm-up", run(part[0]), len(part[0]), **check_server(sup)))
        rss0 = sup.rss_mb()

        stop = threading.Event()
        staller = threading.Thread(target=stall_detokenizer, args=(sup, args.stalls, args.stall_s, args.stall_gap_s,
                                                                   stop, log), daemon=True)
        staller.start()
        res = run(part[1])
        stop.set()
        staller.join()
        phases.append(phase("stalls", res, len(part[1]), **check_server(sup)))
        rss1 = sup.rss_mb()

        kill_rc: list[Optional[int]] = []

        def killer() -> None:
            try:
                kill_rc.append(kill_worker(sup, log))
                sup.restart()
                log.append(f"restarted: /health_generate OK at {sup.url}")
            except Exception as e:  # the clients must not wait for a server that never comes
                log.append(f"kill/restart failed: {type(e).__name__}: {e}")
                sup.end_outage()

        kill_thread = threading.Thread(target=killer, daemon=True)
        trigger = max(1, len(part[2]) // 3)
        res = run(part[2], on_done=lambda k: k == trigger and kill_thread.start())
        kill_thread.join(sup.ready_timeout + 180)
        phases.append(phase("kill", res, len(part[2]), worker_kill_exit_code=kill_rc[0] if kill_rc else None,
                            **check_server(sup)))

        sup.restart(flags[2:] + ["--max-total-tokens", str(args.pressure_tokens),
                                 "--max-queued-requests", str(args.pressure_queue)])
        log.append(f"restarted with --max-total-tokens {args.pressure_tokens} "
                   f"--max-queued-requests {args.pressure_queue}")
        phases.append(phase("pressure", run(part[3]), len(part[3]), **check_server(sup)))
    finally:
        sup.stop()
    return summarize(args, phases, log, sup, rss0, rss1, time.monotonic() - t_start)


def summarize(args: argparse.Namespace, phases: list[dict[str, Any]], log: list[str], sup: Supervisor,
              rss0: float, rss1: float, duration: float) -> dict[str, Any]:
    total = Counter()
    for p in phases:
        total.update(p["counts"])
    growth = 100.0 * (rss1 - rss0) / rss0
    kill = next(p for p in phases if p["phase"] == "kill")
    pressure = phases[-1]
    checks = {
        "zero_lost": total["lost"] == 0 and total["not_run"] == 0,
        "zero_wrong": total["wrong"] == 0,
        "zero_leaked_slots": all(p["held_slots"] == 0 for p in phases),
        "invariants_ok": all(p["invariants_ok"] for p in phases),
        "worker_kill_exit_nonzero": kill["worker_kill_exit_code"] not in (None, 0),
        "restart_healthy": kill["requests"] > 0 and kill["counts"].get("ok", 0) > 0,
        "rss_within_bound": args.rss_bound_pct is None or growth <= args.rss_bound_pct,
    }
    return {"requests": args.requests, "concurrency": args.concurrency, "seed": args.seed,
            "duration_s": round(duration, 1), "counts": dict(total), "phases": phases, "faults": log,
            "server_exit_codes": sup.exit_codes, "restarts": sup.restarts,
            "rss_mb": {"after_warmup": round(rss0, 1), "end": round(rss1, 1), "growth_pct": round(growth, 2),
                       "bound_pct": args.rss_bound_pct},
            "retractions_under_pressure": pressure["retractions"], "checks": checks, "pass": all(checks.values())}


def human(summary: dict[str, Any]) -> str:
    c, r = summary["counts"], summary["rss_mb"]
    counts = ", ".join(f"{k} {v}" for k, v in sorted(c.items()) if v)
    failed = [k for k, v in summary["checks"].items() if not v]
    return (f"soak: {summary['requests']} requests at concurrency {summary['concurrency']} in "
            f"{summary['duration_s']:.0f} s: {counts}; server exits {summary['server_exit_codes']}; "
            f"retractions under pressure {summary['retractions_under_pressure']}; "
            f"RSS {r['after_warmup']:.0f} -> {r['end']:.0f} MiB ({r['growth_pct']:+.1f}%): "
            + ("PASS" if summary["pass"] else f"FAIL ({', '.join(failed)})"))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="HF directory or .gguf (default: SmolLM2-135M)")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--deadline-s", type=float, default=300.0, help="per request")
    p.add_argument("--max-minutes", type=float, default=60.0, help="no new request after this")
    p.add_argument("--max-total-tokens", type=int, default=8192, help="KV pool of the first phases")
    p.add_argument("--pressure-tokens", type=int, default=1024, help="KV pool of the pressure phase")
    p.add_argument("--pressure-queue", type=int, default=24, help="--max-queued-requests of the pressure phase")
    p.add_argument("--stalls", type=int, default=3)
    p.add_argument("--stall-s", type=float, default=3.0)
    p.add_argument("--stall-gap-s", type=float, default=8.0)
    p.add_argument("--rss-bound-pct", type=float, default=None, help="fail when RSS grows more (report only if unset)")
    p.add_argument("--json", default=None, help="also write the summary here")
    p.add_argument("server_args", nargs="*", help="extra server flags (after --)")
    return p


def main(argv: Optional[list[str]] = None) -> int:
    args = parser().parse_args(argv)
    summary = run_soak(args)
    text = json.dumps(summary, indent=1)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)
    print(text)
    print(human(summary))
    return 0 if summary["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
