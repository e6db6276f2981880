"""The LLM programs suite: every workload on every engine, at 1, 8 and 32 concurrent programs,
in one run on one machine.

    .venv/bin/python -m benchmarks.programs.run --json-out benchmarks/results/programs.json
    .venv/bin/python -m benchmarks.programs.run --engines radixserve-http,radixserve --workloads mmlu \\
        --programs 1:2,8:8 --json-out /tmp/p.json                                               # smoke

Per engine, per workload: one untimed program (grammar compilation, first-call costs), then for
each concurrency C a cold cache (``reset``), the run_batch prefix hint, and N programs on C
threads (``frontend_lang``'s ``run_batch`` semantics: the hint, then each program on its own
thread).  Recorded per cell: programs/s, each program's latency (p50, p99), the engine's own
token counters over the cell (prompt, cached, generated, computed: ``engines.py``), hit rate,
and every program's outputs (generated text, select decisions), compared across engines.
A workload that needs a feature an engine lacks is marked unsupported there, with the reason.
Peers whose Python is missing are skipped, saying how to install them (benchmarks/README.md).
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from benchmarks.peers_report import machine
from benchmarks.programs import engines as E
from benchmarks.programs.registry import WORKLOADS
from benchmarks.programs.spec import Workload
from frontend_lang.batch import run_program, send_prefix_hint
from frontend_lang.errors import BackendError


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def run_cell(wl: Workload, backend: Any, concurrency: int) -> dict[str, Any]:
    """All of ``wl``'s programs on ``concurrency`` threads after the batch's prefix hint."""
    fn = wl.function
    runs = [fn.split_kwargs({**wl.sampling, **kw}) for kw in wl.args]
    latencies: list[float] = [0.0] * len(runs)
    states: list[Any] = [None] * len(runs)

    def one(i: int) -> None:
        t0 = time.perf_counter()
        kwargs, defaults = runs[i]
        states[i] = run_program(fn.func, backend, (), kwargs, defaults)
        latencies[i] = time.perf_counter() - t0

    t0 = time.perf_counter()
    if len(runs) >= 2:
        send_prefix_hint(fn.func, runs, backend)
    with ThreadPoolExecutor(concurrency) as pool:
        for f in [pool.submit(one, i) for i in range(len(runs))]:
            f.result()
    wall = time.perf_counter() - t0
    errors = [st.error() for st in states if st.error() is not None]
    if errors:
        raise errors[0]
    return {"programs": len(runs), "wall_s": wall, "programs_per_s": len(runs) / wall,
            "latency_p50_s": statistics.median(latencies), "latency_p99_s": percentile(latencies, 0.99),
            "outputs": [wl.outputs(st) for st in states]}


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before.get(k, 0) for k in after}


def bench_engine(eng: E.Engine, names: list[str], levels: list[tuple[int, int]], seed: int,
                 scale: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in names:
        res: dict[str, Any] = {"cells": {}}
        out[name] = res
        try:
            runner = eng.run_cell or (lambda wl, conc: run_cell(wl, eng.backend, conc))
            runner(WORKLOADS[name](1, seed + 1000, scale=scale), 1)
            for conc, n in levels:
                wl = WORKLOADS[name](n, seed, scale=scale)
                eng.reset()
                before = eng.counters()
                cell = runner(wl, conc)
                used = delta(eng.counters(), before)
                used["hit_rate"] = used["cached_tokens"] / used["prompt_tokens"] if used.get("prompt_tokens") else None
                cell["counters"] = used
                cell["computed_per_program"] = used["computed_tokens"] / n
                res["cells"][str(conc)] = cell
                lat = "" if cell["latency_p50_s"] is None else (f"p50 {cell['latency_p50_s']:7.2f} s  "
                                                                f"p99 {cell['latency_p99_s']:7.2f} s  ")
                print(f"  {eng.name:16s} {name:20s} C={conc:<3d} n={n:<3d} {cell['programs_per_s']:8.3f} prog/s  {lat}"
                      f"hit {used['hit_rate'] or 0:5.1%}  computed/prog {cell['computed_per_program']:8.0f}",
                      flush=True)
        except BackendError as e:
            if e.status == 501:
                res["unsupported"] = str(e)
                print(f"  {eng.name:16s} {name:20s} unsupported: {e}", flush=True)
            else:
                res["error"] = f"{e}"
                print(f"  {eng.name:16s} {name:20s} ERROR {e}", flush=True)
        except Exception as e:  # one workload's failure must not lose the others' numbers
            res["error"] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
    return out


def start(name: str, a: argparse.Namespace, model: str, hf_dir: str, logdir: str) -> E.Engine:
    if name == "radixserve-http":
        return E.radixserve_http(model, a.dtype, a.server_arg, logdir)
    if name == "sglang-client":
        return E.radixserve_http(model, a.dtype, a.server_arg, logdir, client="sglang")
    if name == "radixserve":
        return E.radixserve_inproc(model, a.dtype, a.server_arg)
    if name == "vllm-server":
        return E.vllm_server(hf_dir, a.vllm_dtype, logdir, a.vllm_python)
    if name == "vllm-offline":
        return E.vllm_offline(hf_dir, a.vllm_dtype, logdir, a.vllm_python)
    if name == "llama.cpp":
        return E.llama_server(model, hf_dir, logdir, a.llama_python)
    raise ValueError(f"--engines: unknown engine {name!r} (known: {', '.join(E.ENGINES)})")


def parse_levels(text: str) -> list[tuple[int, int]]:
    """``1:4,8:16`` -> [(1, 4), (8, 16)]: (concurrent programs, programs run)."""
    levels = []
    for part in text.split(","):
        c, _, n = part.partition(":")
        levels.append((int(c), int(n or c)))
    return levels


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--model", default=None, help=".gguf (default: SmolLM2-135M-Instruct Q4_1)")
    p.add_argument("--engines", default=",".join(E.ENGINES))
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--programs", default="1:2,8:8,32:32", help="CONCURRENCY:PROGRAMS,... (default %(default)s)")
    p.add_argument("--scale", type=float, default=1.0, help="scales every workload's token budgets")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="auto", help="radixserve's --dtype")
    p.add_argument("--server-arg", action="append", default=[],
                   help="extra `radixserve serve` argument (the in-process engine is built from the same flags)")
    p.add_argument("--vllm-dtype", default="bfloat16")
    p.add_argument("--vllm-python", default=None)
    p.add_argument("--llama-python", default=None)
    p.add_argument("--json-out", default=None)
    a = p.parse_args(argv)

    from radixserve.model.loader import default_model_path, resolve_hf_dir

    model = a.model or default_model_path()
    hf_dir = resolve_hf_dir(model)
    names = [w for w in a.workloads.split(",") if w]
    unknown = [w for w in names if w not in WORKLOADS]
    if unknown:
        p.error(f"--workloads: unknown {unknown} (known: {', '.join(WORKLOADS)})")
    levels = parse_levels(a.programs)
    logdir = tempfile.mkdtemp(prefix="programs_")
    report: dict[str, Any] = {"machine": machine(), "model": model, "levels": levels, "scale": a.scale,
                              "dtype": a.dtype, "vllm_dtype": a.vllm_dtype, "logs": logdir, "engines": {}}
    print(f"machine: {report['machine']}; logs in {logdir}", flush=True)
    for name in [e for e in a.engines.split(",") if e]:
        try:
            eng = start(name, a, model, hf_dir, logdir)
        except Exception as e:
            print(f"{name}: skipped: {e}", flush=True)
            report["engines"][name] = {"skipped": str(e)}
            continue
        print(f"{name}: started", flush=True)
        results: dict[str, Any] = {}
        report["engines"][name] = {"info": eng.info, "workloads": results}
        try:
            groups = [[w] for w in names] if eng.fresh_per_workload else [names]
            for i, group in enumerate(groups):
                if i:
                    eng = start(name, a, model, hf_dir, logdir)
                try:
                    results.update(bench_engine(eng, group, levels, a.seed, a.scale))
                finally:
                    eng.close()
        except Exception as e:  # a restart that failed: the workloads measured so far stay
            print(f"{name}: stopped: {e}", flush=True)
            report["engines"][name]["stopped"] = str(e)
        if a.json_out:  # after every engine: a long run keeps what it measured
            with open(a.json_out, "w") as f:
                json.dump(report, f, indent=1)
    from benchmarks.programs.report import render

    print(render(report))
    return report


if __name__ == "__main__":
    main()
