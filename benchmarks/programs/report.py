"""The programs suite's JSON as markdown tables and a plot.

* per workload and concurrency: each engine's programs/s, p50/p99 latency, hit rate and
  tokens computed per program;
* the summary: radixserve (over HTTP: what a server user gets) against vLLM's best
  configuration (its server or its offline API, whichever is faster in that cell), per
  workload and as the geometric mean, with the computed-token ratio that explains it;
* output agreement: radixserve over HTTP against in process (must be identical), peers
  against radixserve (greedy; a peer's numerics may differ).

    .venv/bin/python -m benchmarks.programs.report benchmarks/results/programs.json [--plot out.png]
"""
from __future__ import annotations

import argparse
import json
import math
from typing import Any, Optional

OURS, OURS_LOCAL = "radixserve-http", "radixserve"
VLLM = ("vllm-server", "vllm-offline")


def cell(report: dict[str, Any], engine: str, workload: str, conc: str) -> Optional[dict[str, Any]]:
    e = report["engines"].get(engine, {})
    return e.get("workloads", {}).get(workload, {}).get("cells", {}).get(conc)


def status(report: dict[str, Any], engine: str, workload: str) -> str:
    e = report["engines"].get(engine, {})
    if "skipped" in e:
        return "not installed"
    w = e.get("workloads", {}).get(workload, {})
    return "unsupported" if "unsupported" in w else ("error" if "error" in w else "")


def best_vllm(report: dict[str, Any], workload: str, conc: str) -> tuple[Optional[str], Optional[dict]]:
    cands = [(e, cell(report, e, workload, conc)) for e in VLLM]
    cands = [(e, c) for e, c in cands if c is not None]
    return max(cands, key=lambda ec: ec[1]["programs_per_s"]) if cands else (None, None)


def geomean(xs: list[float]) -> Optional[float]:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def agreement(report: dict[str, Any], engine: str, ref: str, workloads: list[str], conc: str) -> str:
    same = total = 0
    for w in workloads:
        a, b = cell(report, engine, w, conc), cell(report, ref, w, conc)
        if a and b:
            for x, y in zip(a["outputs"], b["outputs"]):
                total += 1
                same += x == y
    return f"{same}/{total}" if total else "-"


def http_against_inproc(report: dict[str, Any], workloads: list[str], concs: list[str]) -> list[str]:
    """Rows of radixserve over HTTP / in process (programs/s) per workload and concurrency; a
    cell under 0.90 (HTTP more than 10% slower) is marked.  Empty where either is missing."""
    if not any(cell(report, OURS_LOCAL, w, c) and cell(report, OURS, w, c) for w in workloads for c in concs):
        return []
    lines = ["", "### radixserve over HTTP against in process (programs/s, HTTP / in process; under 0.90 marked)",
             "", "| workload | " + " | ".join(f"C={c}" for c in concs) + " |", "|---" * (len(concs) + 1) + "|"]
    worst: Optional[float] = None
    for w in workloads:
        row = []
        for c in concs:
            http, local = cell(report, OURS, w, c), cell(report, OURS_LOCAL, w, c)
            if http is None or local is None:
                row.append("-")
                continue
            r = http["programs_per_s"] / local["programs_per_s"]
            worst = r if worst is None else min(worst, r)
            row.append(f"{r:.2f}" + (" (under 0.90)" if r < 0.9 else ""))
        lines.append(f"| {w} | " + " | ".join(row) + " |")
    lines.append(f"| **lowest** | {worst:.2f} |" + " |" * (len(concs) - 1))
    return lines


def render(report: dict[str, Any]) -> str:
    engines = [e for e in report["engines"]]
    workloads: list[str] = []
    for e in report["engines"].values():
        workloads += [w for w in e.get("workloads", {}) if w not in workloads]
    concs = [str(c) for c, _ in report["levels"]]
    m = report["machine"]
    lines = [f"Machine: {m['cpu']}, {m['cpus']} CPUs, flags {' '.join(m['flags']) or '-'}; model {report['model']}; "
             f"radixserve dtype {report['dtype']}, vLLM dtype {report['vllm_dtype']}", ""]
    for e, info in report["engines"].items():
        if "skipped" in info:
            lines.append(f"- {e}: skipped: {info['skipped']}")
    for c in concs:
        lines += ["", f"### {c} concurrent program(s): programs/s (p50 / p99 latency s; hit rate; computed tokens "
                      "per program)", "", "| workload | " + " | ".join(engines) + " |",
                  "|---" * (len(engines) + 1) + "|"]
        for w in workloads:
            row = []
            for e in engines:
                x = cell(report, e, w, c)
                if x is None:
                    row.append(status(report, e, w) or "-")
                    continue
                hit = x["counters"].get("hit_rate")
                lat = "-" if x["latency_p50_s"] is None else f"{x['latency_p50_s']:.2f} / {x['latency_p99_s']:.2f}"
                row.append(f"{x['programs_per_s']:.3f} ({lat}; {(hit or 0):.0%}; {x['computed_per_program']:.0f})")
            lines.append(f"| {w} | " + " | ".join(row) + " |")
    lines += ["", "### radixserve over HTTP against vLLM's best configuration (programs/s ratio; computed "
                  "tokens vLLM / radixserve)", "", "| workload | " + " | ".join(f"C={c}" for c in concs) + " |",
              "|---" * (len(concs) + 1) + "|"]
    per_c: dict[str, list[float]] = {c: [] for c in concs}
    for w in workloads:
        row = []
        for c in concs:
            ours = cell(report, OURS, w, c)
            name, theirs = best_vllm(report, w, c)
            if ours is None or theirs is None:
                row.append("-")
                continue
            ratio = ours["programs_per_s"] / theirs["programs_per_s"]
            work = theirs["computed_per_program"] / max(ours["computed_per_program"], 1e-9)
            per_c[c].append(ratio)
            row.append(f"{ratio:.2f}x vs {name.split('-')[1]} (work {work:.2f}x)")
        lines.append(f"| {w} | " + " | ".join(row) + " |")
    gm = [geomean(per_c[c]) for c in concs]
    lines.append("| **geometric mean** | " + " | ".join("-" if g is None else f"**{g:.2f}x**" for g in gm) + " |")
    lines += http_against_inproc(report, workloads, concs)
    lines += ["", "Outputs identical to radixserve over HTTP (programs, all concurrencies):"]
    for e in engines:
        if e != OURS and "workloads" in report["engines"][e]:
            agree = ", ".join(f"C={c} {agreement(report, e, OURS, workloads, c)}" for c in concs)
            lines.append(f"- {e}: {agree}")
    for e, info in report["engines"].items():
        for w, res in info.get("workloads", {}).items():
            if "unsupported" in res or "error" in res:
                lines.append(f"- {e} / {w}: {res.get('unsupported') or res.get('error')}")
    return "\n".join(lines)


def plot(report: dict[str, Any], path: str) -> Optional[str]:
    """Bars of programs/s per workload and engine at the highest concurrency (log scale)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot: skipped, matplotlib is not installed (pip install matplotlib)")
        return None
    conc = str(report["levels"][-1][0])
    engines = [e for e, i in report["engines"].items() if "workloads" in i]
    workloads = list(next(iter(report["engines"][e]["workloads"] for e in engines)))
    fig, ax = plt.subplots(figsize=(1.1 * len(workloads) + 2, 4))
    width = 0.8 / max(1, len(engines))
    for k, e in enumerate(engines):
        ys = [(cell(report, e, w, conc) or {}).get("programs_per_s", 0) for w in workloads]
        ax.bar([i + k * width for i in range(len(workloads))], ys, width, label=e)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(workloads))], workloads, rotation=35, ha="right")
    ax.set_yscale("log")
    ax.set_ylabel(f"programs/s at {conc} concurrent")
    ax.set_title(report["machine"]["cpu"])
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("json")
    p.add_argument("--plot", default=None)
    a = p.parse_args()
    with open(a.json) as f:
        report = json.load(f)
    print(render(report))
    if a.plot:
        plot(report, a.plot)


if __name__ == "__main__":
    main()
