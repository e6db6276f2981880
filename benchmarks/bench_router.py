"""The data-parallel router on the generated-shared-prefix workload: prefix-cache hit rate and
throughput of one replica, two replicas behind the cache-aware router, and two behind
round-robin, measured in one run on this machine.

    .venv/bin/python benchmarks/bench_router.py                # SmolLM2, 8 groups x 8 prompts
    .venv/bin/python benchmarks/bench_router.py --model DIR --groups 8 --prompts-per-group 8

Starts two ``radixserve serve`` replicas and one ``radixserve router`` per policy on loopback
ports; every mode starts from flushed caches and sends the same requests (group-major
prompts, shuffled with a fixed seed) at ``--concurrency``.  Hit rate = cached prompt tokens
/ prompt tokens, from each answer's ``meta_info``.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from workloads import add_shared_prefix_args, shared_prefix_prompts  # noqa: E402


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], log: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    f = open(log, "w")
    proc = subprocess.Popen([sys.executable, "-m", "radixserve.cli", *cmd, "--port", str(port)], stdout=f,
                            stderr=subprocess.STDOUT, env=dict(os.environ, TOKENIZERS_PARALLELISM="false"))
    return proc, f"http://127.0.0.1:{port}"


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{url} exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{url} not ready after {timeout}s")


async def run(url: str, prompts: list[list[int]], out_len: int, concurrency: int) -> dict:
    sem = asyncio.Semaphore(concurrency)
    body = {"sampling_params": {"max_new_tokens": out_len, "ignore_eos": True, "temperature": 0}}

    async def one(c: httpx.AsyncClient, ids: list[int]) -> tuple[int, int, int]:
        async with sem:
            r = await c.post(url + "/generate", json={"input_ids": ids, **body})
            r.raise_for_status()
            m = r.json()["meta_info"]
            return m["prompt_tokens"], m["cached_tokens"], m["completion_tokens"]

    t0 = time.perf_counter()
    async with httpx.AsyncClient(timeout=900) as c:
        done = await asyncio.gather(*(one(c, p) for p in prompts))
    dt = time.perf_counter() - t0
    prompt, cached, out = (sum(x[i] for x in done) for i in range(3))
    return {"hit_rate": cached / prompt, "seconds": dt, "output_tok_s": out / dt, "requests": len(done)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the results as JSON here")
    add_shared_prefix_args(p)
    p.set_defaults(groups=8, prompts_per_group=8, output_len=32)
    args = p.parse_args()
    model = ["--model", args.model] if args.model else []
    procs = []
    try:
        replicas = [start(["serve", *model, "--log-level", "warning"], f"/tmp/bench_router_replica{i}.log")
                    for i in range(2)]
        procs += [pr for pr, _ in replicas]
        for pr, url in replicas:
            wait_healthy(url, pr)
        urls = [u for _, u in replicas]
        vocab = httpx.get(urls[0] + "/get_server_info", timeout=10).json()["worker"]["vocab_size"]
        prompts = shared_prefix_prompts(args.groups, args.prompts_per_group, args.system_len, args.question_len,
                                        vocab, args.seed)
        random.Random(args.seed).shuffle(prompts)
        routers = {}
        for policy in ("cache_aware", "round_robin"):
            pr, url = start(["router", "--worker-urls", *urls, "--policy", policy, "--log-level", "warning"],
                            f"/tmp/bench_router_{policy}.log")
            procs.append(pr)
            wait_healthy(url, pr)
            routers[policy] = url
        results = {}
        warm = shared_prefix_prompts(1, 2, 64, 8, vocab, args.seed + 1)
        for name, url in [("one replica", urls[0]), ("router cache_aware", routers["cache_aware"]),
                          ("router round_robin", routers["round_robin"])]:
            for u in urls:
                httpx.post(u + "/flush_cache", timeout=60).raise_for_status()
            asyncio.run(run(url, warm, 4, 2))  # warm both paths, then a clean cache
            for u in urls:
                httpx.post(u + "/flush_cache", timeout=60).raise_for_status()
            results[name] = asyncio.run(run(url, prompts, args.output_len, args.concurrency))
            r = results[name]
            print(f"{name:20s} hit rate {r['hit_rate'] * 100:5.1f}%  {r['seconds']:6.1f} s  "
                  f"{r['output_tok_s']:7.1f} output tok/s", flush=True)
        base = results["one replica"]["hit_rate"]
        print(f"cache_aware - one replica: {(results['router cache_aware']['hit_rate'] - base) * 100:+.1f} points; "
              f"round_robin - one replica: {(results['router round_robin']['hit_rate'] - base) * 100:+.1f} points")
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"args": vars(args), "results": results}, f, indent=1)
    finally:
        for pr in procs:
            pr.terminate()
        for pr in procs:
            try:
                pr.wait(20)
            except subprocess.TimeoutExpired:
                pr.kill()


if __name__ == "__main__":
    main()
