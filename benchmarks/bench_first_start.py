"""A first start of ``radixserve serve`` on the default model, as on a fresh machine: its stages.

Starts ``radixserve serve`` (the default SmolLM2 GGUF, every option at its default, ``--log-level
info``) with an empty ``$RADIXSERVE_CACHE``, so that it converts the GGUF, times the numerics and
attention paths and checks a quantization's accuracy as a first start does; the compiled native
kernels are linked in from the usual cache (``--compile`` builds them too: one more stage, the
compiler's time).  ``--load N`` runs N busy-looping processes beside it (a busy machine).  Waits
for ``/health``, then prints from its log each stage's duration (the "done in" lines of
``radixserve/proc/stages.py``), the timing and accuracy work (numerics timing, attention timing,
accuracy check), the longest silence between two log lines, whether any table was left uncached
as noisy, and the ``numerics auto`` choice; then the same again on the caches it wrote (a warm start).

    .venv/bin/python -m benchmarks.bench_first_start [--load 2] [--compile]
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import httpx

from tests.helpers.server_harness import free_port

STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (\w+)\] \w+ ([\w.]+): (.*)$")
DONE = re.compile(r"^([A-Za-z ]+): done in ([\d.]+) s")
TUNING = ("numerics timing", "attention timing", "accuracy check")


def start(cache: str, timeout: float) -> tuple[float, str]:
    """(seconds from launch to the first /health 200, the server's log)."""
    port = free_port()
    log_path = os.path.join(cache, f"serve-{port}.log")
    env = dict(os.environ, RADIXSERVE_CACHE=cache, TOKENIZERS_PARALLELISM="false")
    with open(log_path, "w") as log:
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "radixserve.cli", "serve", "--port", str(port),
                                 "--log-level", "info"], stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            while time.perf_counter() - t0 < timeout:
                if proc.poll() is not None:
                    raise RuntimeError(f"server exited with {proc.returncode}: {open(log_path).read()[-3000:]}")
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
            else:
                raise TimeoutError(f"not ready after {timeout} s")
            ready = time.perf_counter() - t0
        finally:
            proc.terminate()
            proc.wait(30)
    kept = os.path.join(tempfile.gettempdir(), f"radixserve-first-start-{port}.log")
    shutil.copy(log_path, kept)
    print(f"(log: {kept})")
    with open(log_path) as f:
        return ready, f.read()


def report(label: str, ready: float, log: str) -> None:
    stamps, stages, choice = [], {}, ""
    for line in log.splitlines():
        m = STAMP.match(line)
        if not m:
            continue
        stamps.append(dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp())
        if m.group(3) == "radixserve.stage" and (d := DONE.match(m.group(4))):
            stages[d.group(1)] = stages.get(d.group(1), 0.0) + float(d.group(2))
        if m.group(4).startswith("numerics auto: "):
            choice = m.group(4).split(" | ")[0].removeprefix("numerics auto: ")
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    print(f"## {label}: ready in {ready:.1f} s")
    for name, s in stages.items():
        print(f"- {name}: {s:.1f} s")
    print(f"- timing and accuracy work: {sum(stages.get(n, 0.0) for n in TUNING):.1f} s")
    print(f"- longest silence between log lines: {max(gaps, default=0):.1f} s")
    print(f"- tables left uncached as noisy: {log.count('still noisy')}; retakes: {log.count('retaking it')}")
    print(f"- numerics auto: {choice or '(cached)'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--load", type=int, default=0, help="busy-looping processes beside the server")
    ap.add_argument("--compile", action="store_true", help="compile the native kernels too (no cache)")
    ap.add_argument("--timeout", type=float, default=900.0)
    args = ap.parse_args()
    from radixserve.model.loader import cache_root

    cache = tempfile.mkdtemp(prefix="radixserve-first-start-")
    if not args.compile:
        os.symlink(os.path.join(cache_root(), "kernels"), os.path.join(cache, "kernels"))
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)]
    try:
        print(f"# first start, cache {cache}, {args.load} busy processes beside it")
        report("first start", *start(cache, args.timeout))
        report("warm start", *start(cache, args.timeout))
    finally:
        for p in spinners:
            p.kill()
            p.wait()
        shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    main()
