"""Who uses the cores while the server works: CPU seconds per process during a load.

Starts ``radixserve serve`` (extra flags after ``--``), sends ``--requests`` concurrent
``/generate`` requests (random token ids, ``--output-len`` tokens each, greedy, ignore_eos)
and reads each process's user+system CPU time from ``/proc/PID/stat`` before and after:
the HTTP server (this script's child) and its children, which name themselves ``rs-worker``,
``rs-scheduler`` and ``rs-detokenizer``.  The worker should own the cores: the others
should use a small share of the wall time.  Linux only.

    .venv/bin/python -m benchmarks.bench_process_cpu --requests 32 -- --dtype float32
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def processes(server_pid: int) -> dict[str, int]:
    found = {"server": server_pid}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/comm") as f:
                    name = f.read().strip()
            except OSError:
                continue
            if name.startswith("rs-"):
                found[name] = int(pid)
    return found


def post(port: int, body: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/generate", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, default=30123)
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("server_args", nargs="*", help="after --: extra flags for radixserve serve")
    args = p.parse_args()
    cmd = [os.path.join(os.path.dirname(sys.executable), "radixserve"), "serve", "--port", str(args.port),
           "--max-total-tokens", "60000", *args.server_args]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{args.port}/health", timeout=2)
                break
            except OSError:
                time.sleep(1)
        rng = random.Random(0)
        sp = {"max_new_tokens": args.output_len, "temperature": 0, "ignore_eos": True}
        post(args.port, {"input_ids": [rng.randrange(100, 40000) for _ in range(16)], "sampling_params": sp})
        procs = processes(server.pid)
        before = {n: cpu_seconds(pid) for n, pid in procs.items()}
        bodies = [{"input_ids": [rng.randrange(100, 40000) for _ in range(args.prompt_len)], "sampling_params": sp}
                  for _ in range(args.requests)]
        t = time.perf_counter()
        with ThreadPoolExecutor(args.requests) as pool:
            list(pool.map(lambda b: post(args.port, b), bodies))
        wall = time.perf_counter() - t
        after = {n: cpu_seconds(pid) for n, pid in procs.items()}
        print(f"{args.requests} requests x ({args.prompt_len} in, {args.output_len} out) in {wall:.2f} s, "
              f"{os.cpu_count()} cores")
        print(f"{'process':>16} {'CPU s':>8} {'% of one core':>14}")
        for name in sorted(procs, key=lambda n: -(after[n] - before[n])):
            used = after[name] - before[name]
            print(f"{name:>16} {used:>8.2f} {100 * used / wall:>13.1f}%")
    finally:
        server.terminate()
        server.wait(timeout=60)


if __name__ == "__main__":
    main()
