"""The data-parallel router on the generated-shared-prefix workload: prefix-cache hit rate and
throughput of one replica, two replicas behind the cache-aware router, and two behind
round-robin, measured in one run on this machine.

    .venv/bin/python -m benchmarks.bench_router                # SmolLM2, 8 groups x 8 prompts
    .venv/bin/python -m benchmarks.bench_router --model DIR --groups 8 --prompts-per-group 8

First one ``radixserve serve`` with every core; then two replicas with half the cores each
(as ``serve --dp-size 2`` starts them) behind one ``radixserve router`` per policy, all on
loopback ports.  Every mode starts from flushed caches and sends the same requests
(group-major prompts, shuffled with a fixed seed) at ``--concurrency``.  Hit rate = cached prompt tokens
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

from benchmarks.workloads import add_shared_prefix_args, shared_prefix_prompts


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], log: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    f = open(log, "w")
    proc = subprocess.Popen([sys.executable, "-m", "radixserve.cli", *cmd, "--port", str(port)], stdout=f,
                            stderr=subprocess.STDOUT, env=dict(os.environ, TOKENIZERS_PARALLELISM="false", **(env or {})))
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


def stop(procs: list[subprocess.Popen]) -> None:
    for pr in procs:
        pr.terminate()
    for pr in procs:
        try:
            pr.wait(30)
        except subprocess.TimeoutExpired:
            pr.kill()


def measure(name: str, url: str, replica_urls: list[str], prompts: list[list[int]], warm: list[list[int]],
            args: argparse.Namespace) -> dict:
    for u in replica_urls:  # warm the path, then start from empty caches
        httpx.post(u + "/flush_cache", timeout=60).raise_for_status()
    asyncio.run(run(url, warm, 4, 2))
    for u in replica_urls:
        httpx.post(u + "/flush_cache", timeout=60).raise_for_status()
    r = asyncio.run(run(url, prompts, args.output_len, args.concurrency))
    print(f"{name:22s} hit rate {r['hit_rate'] * 100:5.1f}%  {r['seconds']:6.1f} s  "
          f"{r['output_tok_s']:7.1f} output tok/s", flush=True)
    return r


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--max-total-tokens", type=int, default=32768, help="KV pool of each server")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the results as JSON here")
    add_shared_prefix_args(p)
    p.set_defaults(groups=8, prompts_per_group=8, output_len=32)
    args = p.parse_args()
    serve = ["serve", "--log-level", "warning", "--max-total-tokens", str(args.max_total_tokens)]
    serve += ["--model", args.model] if args.model else []
    cores = os.cpu_count() or 1
    results: dict[str, dict] = {}
    procs: list[subprocess.Popen] = []
    try:
        # one replica with every core
        pr, url = start(serve, "/tmp/bench_router_single.log")
        procs = [pr]
        wait_healthy(url, pr)
        vocab = httpx.get(url + "/get_server_info", timeout=10).json()["worker"]["vocab_size"]
        prompts = shared_prefix_prompts(args.groups, args.prompts_per_group, args.system_len, args.question_len,
                                        vocab, args.seed)
        random.Random(args.seed).shuffle(prompts)
        warm = shared_prefix_prompts(1, 2, 64, 8, vocab, args.seed + 1)
        results["one replica"] = measure("one replica", url, [url], prompts, warm, args)
        stop(procs)
        # two replicas sharing the cores (as serve --dp-size 2 starts them), one router per policy
        env = {"OMP_NUM_THREADS": str(max(1, cores // 2))}
        replicas = [start(serve, f"/tmp/bench_router_replica{i}.log", env) for i in range(2)]
        procs = [pr for pr, _ in replicas]
        for pr, u in replicas:
            wait_healthy(u, pr)
        urls = [u for _, u in replicas]
        for policy in ("cache_aware", "round_robin"):
            pr, url = start(["router", "--worker-urls", *urls, "--policy", policy, "--log-level", "warning"],
                            f"/tmp/bench_router_{policy}.log")
            procs.append(pr)
            wait_healthy(url, pr)
            results[f"2 replicas, {policy}"] = measure(f"2 replicas, {policy}", url, urls, prompts, warm, args)
        base = results["one replica"]
        for name, r in results.items():
            print(f"{name:22s} hit rate {(r['hit_rate'] - base['hit_rate']) * 100:+5.1f} points, "
                  f"throughput x{r['output_tok_s'] / base['output_tok_s']:.2f} vs one replica")
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"args": vars(args), "cores": cores, "results": results}, f, indent=1)
    finally:
        stop(procs)


if __name__ == "__main__":
    main()
