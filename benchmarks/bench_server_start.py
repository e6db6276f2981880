"""How long a tiny-model server takes to become ready, and what each of its processes imports.

Builds the tests' tiny random Llama (SmolLM2's tokenizer) once, then ``--runs`` times starts
``radixserve serve`` on it as the tests' shared server does (``tests/helpers/server_harness.py``:
fp32, an 8,192-token KV pool, 256-token prefill chunks) and times launch to the first
``/health`` 200, with the CPU seconds its processes used by then (which a busy machine changes
less); prints each run and the medians.  Then one more start under ``-X importtime`` (a
``sitecustomize`` sends each interpreter's stderr to a file of its own) lists, for the server
and each child (``rs-*``), the seconds spent importing and whether ``transformers``, ``torch``,
``numpy``, ``tokenizers`` and ``jinja2`` were loaded by the time the server was ready (import
timing slows that start; its ready time is not counted).

    .venv/bin/python -m benchmarks.bench_server_start --runs 5
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import tempfile
import time

from tests.helpers.server_harness import ServerHandle, process_names

FLAGS = ("--max-total-tokens", "8192", "--chunked-prefill-size", "256")  # as shared_server
HEAVY = ("transformers", "torch", "numpy", "tokenizers", "jinja2")
_LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \| ( *)(\S+)")
_SITECUSTOMIZE = """\
import os
_d = os.environ.get("RS_BENCH_IMPORT_DIR")
if _d:  # this interpreter's stderr (and so its -X importtime lines) to a file of its own
    os.dup2(os.open(os.path.join(_d, f"{os.getpid()}.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), 2)
"""


def tiny_model(folder: str) -> str:
    from radixserve.model.loader import resolve_hf_dir
    from tests.helpers.models import build_tiny_llama

    return build_tiny_llama(resolve_hf_dir(None), os.path.join(folder, "tiny_llama"))


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def time_ready(model: str) -> tuple[float, float]:
    """(seconds from launch to the first /health 200, CPU seconds its processes used by then)."""
    t0 = time.perf_counter()
    srv = ServerHandle(model, *FLAGS)
    try:
        srv.wait_ready(120)
        wall = time.perf_counter() - t0
        return wall, sum(cpu_seconds(pid) for pid in process_names(srv.proc.pid))
    finally:
        srv.stop()


def import_report(log: str) -> tuple[float, set[str]]:
    """(seconds of top-level imports, the heavy top-level packages imported) from one importtime log."""
    total, heavy = 0, set()
    with open(log) as f:
        for line in f:
            m = _LINE.match(line)
            if m is None:
                continue
            name = m.group(4)
            if not m.group(3):
                total += int(m.group(2))
            if name.split(".")[0] in HEAVY:
                heavy.add(name.split(".")[0])
    return total / 1e6, heavy


def imports_run(model: str, folder: str, logs: str) -> None:
    site = os.path.join(folder, "site")
    os.makedirs(site)
    os.makedirs(logs, exist_ok=True)
    with open(os.path.join(site, "sitecustomize.py"), "w") as f:
        f.write(_SITECUSTOMIZE)
    saved = dict(os.environ)
    os.environ.update(RS_BENCH_IMPORT_DIR=logs, PYTHONPROFILEIMPORTTIME="1",
                      PYTHONPATH=os.pathsep.join(p for p in (site, os.getcwd(), saved.get("PYTHONPATH")) if p))
    try:
        srv = ServerHandle(model, *FLAGS)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    try:
        srv.wait_ready(240)
        names = process_names(srv.proc.pid)
        reports = {pid: import_report(os.path.join(logs, f"{pid}.log")) for pid in names
                   if os.path.exists(os.path.join(logs, f"{pid}.log"))}  # what was imported by ready
    finally:
        srv.stop()
    print(f"{'process':<16} {'import s':>8}  " + "  ".join(f"{h:<12}" for h in HEAVY))
    for pid, (secs, heavy) in sorted(reports.items(), key=lambda kv: names[kv[0]]):
        print(f"{names[pid]:<16} {secs:8.2f}  " + "  ".join(f"{'yes' if h in heavy else 'no':<12}" for h in HEAVY))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--model", help="a model folder (default: the tests' tiny random Llama, built here)")
    p.add_argument("--no-imports", action="store_true", help="skip the per-process import report")
    p.add_argument("--import-logs", help="keep the importtime logs (PID.log) in this folder")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-server-start-") as folder:
        model = args.model or tiny_model(folder)
        time_ready(model)  # warm the page cache; not counted
        times, cpus = [], []
        for i in range(args.runs):
            wall, cpu = time_ready(model)
            times.append(wall)
            cpus.append(cpu)
            print(f"run {i + 1}: ready in {wall:.2f} s, {cpu:.2f} CPU s", flush=True)
        if times:
            print(f"median of {args.runs}: ready in {statistics.median(times):.2f} s (min {min(times):.2f}, "
                  f"max {max(times):.2f}), {statistics.median(cpus):.2f} CPU s; "
                  f"load average {os.getloadavg()[0]:.2f}")
        if not args.no_imports:
            imports_run(model, folder, args.import_logs or os.path.join(folder, "imports"))


if __name__ == "__main__":
    main()
