"""Starvation under longest-prefix-match scheduling: TTFT of cache hits and misses.

Workload: ``--num-requests`` requests arriving as a Poisson stream (``--request-rate`` per
second); ``--hit-share`` of them (90%) start with one shared ``--prefix-len``-token prefix and
add ``--question-len`` tokens of their own, the rest are unique prompts of the same length.
Each generates ``--output-len`` tokens (greedy, ``ignore_eos``).  Token ids are random, from
``numpy.random.default_rng(--seed)``; the arrival times and prompts are the same for every
policy.

The same in-process ``Engine`` runs the workload once per policy -- ``fcfs``, plain ``lpm``
(``max_queue_wait_s=0``) and ``lpm`` with the wait bound (``--max-queue-wait-s``) -- with the
cache flushed in between.  The driver adds each request to the scheduler once its arrival time
has passed and steps; TTFT is the time from arrival until the step that sampled the first
token (scheduler-side: no HTTP or detokenizer).  ``--max-running-requests`` caps the batch so
that a queue forms near capacity, which is where the order matters.

Reported per policy: TTFT p50/p99 of hits and of misses, the hit rate (cached / prompt tokens)
and the two targets of the bounded policy: p99 TTFT of misses <= 2x FCFS's, hit rate within
2 points of plain LPM's.

    .venv/bin/python -m benchmarks.bench_starvation                      # SmolLM2, defaults
    .venv/bin/python -m benchmarks.bench_starvation --num-requests 60 --request-rate 4   # smoke
"""
from __future__ import annotations

import argparse
import time
from dataclasses import replace
from typing import Any

import numpy as np

from benchmarks.report import write_json


def workload(args: argparse.Namespace, vocab: int) -> tuple[list[list[int]], list[bool], list[float]]:
    """(prompts, is_hit per request, arrival offsets in seconds)."""
    rng = np.random.default_rng(args.seed)
    ids = lambda k: rng.integers(100, vocab - 100, k).tolist()  # noqa: E731
    prefix = ids(args.prefix_len)
    hits = (rng.random(args.num_requests) < args.hit_share).tolist()
    prompts = [prefix + ids(args.question_len) if h else ids(args.prefix_len + args.question_len) for h in hits]
    arrivals = np.cumsum(rng.exponential(1.0 / args.request_rate, args.num_requests)).tolist()
    return prompts, hits, arrivals


def run_policy(eng: Any, prompts: list[list[int]], arrivals: list[float], params: dict) -> tuple[list, list]:
    """Replay the arrivals against the engine's scheduler; (ttft per request, cached tokens)."""
    reqs, _ = eng.make_requests(None, params, prompts, False, -1, 0)

    def drive(sched) -> list[float]:
        first = [None] * len(reqs)
        t0 = time.perf_counter()
        added = 0
        while added < len(reqs) or sched.has_work():
            now = time.perf_counter() - t0
            while added < len(reqs) and arrivals[added] <= now:
                reqs[added].arrival = t0 + arrivals[added]
                sched.add_request(reqs[added])
                added += 1
            if not sched.has_work():
                time.sleep(max(0.0, arrivals[added] - (time.perf_counter() - t0)))
                continue
            sched.step()
            done = time.perf_counter()
            for i in range(added):
                if first[i] is None and reqs[i].output_ids:
                    first[i] = done - reqs[i].arrival
        sched.check_invariants()
        return first

    ttft = eng.run_on_driver(drive)
    return ttft, [r.cached_tokens for r in reqs]


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


def summarize(name: str, ttft: list[float], cached: list[int], prompts: list[list[int]], hits: list[bool]) -> dict:
    h = [t for t, is_hit in zip(ttft, hits) if is_hit]
    m = [t for t, is_hit in zip(ttft, hits) if not is_hit]
    return {"policy": name, "hit_p50": pct(h, 50), "hit_p99": pct(h, 99), "miss_p50": pct(m, 50),
            "miss_p99": pct(m, 99), "hit_rate": sum(cached) / sum(len(p) for p in prompts),
            "all_p99": pct(ttft, 99)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="HF directory or .gguf (default: SmolLM2-135M-Instruct)")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--num-requests", type=int, default=400)
    p.add_argument("--request-rate", type=float, default=8.0, help="Poisson arrivals per second")
    p.add_argument("--hit-share", type=float, default=0.9)
    p.add_argument("--prefix-len", type=int, default=256)
    p.add_argument("--question-len", type=int, default=16)
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--max-running-requests", type=int, default=16)
    p.add_argument("--max-total-tokens", type=int, default=20000)
    p.add_argument("--max-queue-wait-s", type=float, default=None,
                   help="the bounded policy's bound (default: SchedulerConfig's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json-out", default=None)
    args = p.parse_args()
    from radixserve import Engine
    from radixserve.config import SchedulerConfig

    bound = SchedulerConfig().max_queue_wait_s if args.max_queue_wait_s is None else args.max_queue_wait_s
    eng = Engine(args.model, dtype=args.dtype, max_total_tokens=args.max_total_tokens,
                 max_running_requests=args.max_running_requests)
    prompts, hits, arrivals = workload(args, eng.info.vocab_size)
    params = {"max_new_tokens": args.output_len, "temperature": 0, "ignore_eos": True}
    eng.generate(input_ids=prompts[:4], sampling_params=params)  # warm-up
    policies = [("fcfs", "fcfs", 0.0), ("lpm", "lpm", 0.0), (f"lpm+bound {bound:g}s", "lpm", bound)]
    rows = []
    for name, policy, wait in policies:
        eng.run_on_driver(lambda s: setattr(s, "cfg", replace(s.cfg, schedule_policy=policy, max_queue_wait_s=wait)))
        assert eng.flush_cache()
        t0 = time.perf_counter()
        ttft, cached = run_policy(eng, prompts, arrivals, params)
        rows.append({**summarize(name, ttft, cached, prompts, hits), "wall_s": time.perf_counter() - t0})
        r = rows[-1]
        print(f"{name:>16}: TTFT hits p50 {r['hit_p50']:.3f} p99 {r['hit_p99']:.3f} s | misses p50 "
              f"{r['miss_p50']:.3f} p99 {r['miss_p99']:.3f} s | hit rate {r['hit_rate']:.1%} | {r['wall_s']:.1f} s",
              flush=True)
    fcfs, lpm, new = rows
    ok_ttft = new["miss_p99"] <= 2 * fcfs["miss_p99"]
    ok_hits = abs(new["hit_rate"] - lpm["hit_rate"]) <= 0.02
    print(f"targets: miss p99 {new['miss_p99']:.3f} <= 2 x FCFS {fcfs['miss_p99']:.3f}: {ok_ttft}; "
          f"hit rate {new['hit_rate']:.1%} within 2 points of LPM {lpm['hit_rate']:.1%}: {ok_hits}")
    write_json(args.json_out, {"args": vars(args), "rows": rows, "targets_met": ok_ttft and ok_hits})
    eng.shutdown()


if __name__ == "__main__":
    main()
