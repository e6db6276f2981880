"""bench_scale.py's JSON as a markdown table and PNG plots (tokens/s against model size and
against context, one line per peer).  Several JSON files are merged shape by shape (later
files win), so shapes measured in separate runs still make one table; each shape's ratios are
of one run.

    .venv/bin/python -m benchmarks.scale_report scale.json [more.json ...] --plots benchmarks/results/scale
    .venv/bin/python -m benchmarks.scale_report before.json after.json --compare
"""
from __future__ import annotations

import argparse
import json
import os
from typing import Any, Optional

PEER_ORDER = ("radixserve", "HF fp32", "llama.cpp", "vLLM")


def figure(res: dict[str, Any], workload: str) -> Optional[float]:
    """Decode tok/s for ``single``, total tok/s for a batch workload."""
    w = res.get(workload)
    if not isinstance(w, dict):
        return None
    return w.get("decode_tok_s") if workload == "single" else w.get("total_tok_s")


def workloads(shape: dict[str, Any]) -> list[str]:
    ours = shape["results"].get("radixserve", {})
    return [w for w in ("single", *shape.get("requests", {})) if w in ours]


def peers(shape: dict[str, Any]) -> list[str]:
    rank = {p: i for i, p in enumerate(PEER_ORDER)}
    return sorted(shape["results"], key=lambda n: (rank.get(n.split(" ")[0], 9), n))


def merged(reports: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for r in reports:
        out.update(r["shapes"])
    return out


def table(reports: list[dict[str, Any]]) -> str:
    """One row per (shape, workload): each peer's figure and radixserve / the best other peer."""
    shapes = merged(reports)
    names: list[str] = []
    for s in shapes.values():
        names += [p for p in peers(s) if p not in names]
    lines = ["| shape | workload | " + " | ".join(names) + " | ours / best peer |",
             "|---|---|" + "---:|" * (len(names) + 1)]
    for shape_name, s in shapes.items():
        for w in workloads(s):
            vals = {p: figure(s["results"][p], w) for p in names if p in s["results"]}
            ours = vals.get("radixserve")
            others = [v for p, v in vals.items() if not p.startswith("radixserve") and v]
            ratio = f"{ours / max(others):.2f}x" if ours and others else "-"
            cells = [f"{vals[p]:,.1f}" if vals.get(p) else "-" for p in names]
            label = "single-stream decode tok/s" if w == "single" else f"{w} total tok/s"
            lines.append(f"| {shape_name} | {label} | " + " | ".join(cells) + f" | {ratio} |")
    return "\n".join(lines)


def efficiency(reports: list[dict[str, Any]]) -> str:
    """radixserve's rooflines per shape: docs GFLOP/s vs the GEMM peak, attention shares, and
    single-stream bytes/s vs the copy rate."""
    rates = [r.get("memory", {}) for r in reports if r.get("memory")]
    mem = max(rates, key=lambda m: m.get("copy_gb_s", 0)) if rates else {}  # the machine's best measurement
    lines = [f"memory: copy {mem.get('copy_gb_s', 0):.1f} GB/s, read {mem.get('read_gb_s', 0):.1f} GB/s", ""]
    lines += ["| shape | workload | GFLOP/s | % of GEMM peak | attention FLOP share | attention time share "
              "(prefill / decode) |", "|---|---|---:|---:|---:|---:|"]
    for name, s in merged(reports).items():
        probes = {p["context"]: p for p in s["results"].get("radixserve", {}).get("probe") or []}
        for w, roof in s.get("roofline", {}).items():
            p = probes.get(int(w.split("_")[1]))
            share = (f"{p['prefill']['share']:.1%} / {p['decode']['share']:.1%}"
                     if p and p["prefill"]["share"] is not None and p["decode"]["share"] is not None else "-")
            lines.append(f"| {name} | {w} | {roof['achieved_gflops']:.0f} | {roof['pct_of_peak']:.1%} of "
                         f"{roof['peak_gflops']:.0f} | {roof['attention_flop_share']:.1%} | {share} |")
    lines += ["", "| shape | peer | bytes/step | decode tok/s | GB/s | % of copy rate |", "|---|---|---:|---:|---:|---:|"]
    for name, s in merged(reports).items():
        for b in s.get("bandwidth", []):
            pct = b["gb_s"] / mem["copy_gb_s"] if mem.get("copy_gb_s") else 0
            lines.append(f"| {name} | {b['peer']} | {b['step_bytes'] / 1e6:,.0f} MB | {b['tok_s']:.1f} | "
                         f"{b['gb_s']:.1f} | {pct:.0%} |")
    return "\n".join(lines)


def compare(old: dict[str, Any], new: dict[str, Any]) -> str:
    """radixserve's figures of two runs, new / old."""
    lines = ["| shape | workload | before | after | after / before |", "|---|---|---:|---:|---:|"]
    for name, s in new["shapes"].items():
        o = old["shapes"].get(name)
        if not o:
            continue
        for w in workloads(s):
            a, b = figure(o["results"].get("radixserve", {}), w), figure(s["results"]["radixserve"], w)
            if a and b:
                lines.append(f"| {name} | {w} | {a:,.1f} | {b:,.1f} | {b / a:.3f}x |")
    return "\n".join(lines)


def plots(reports: list[dict[str, Any]], folder: str) -> list[str]:
    """tok/s against parameters (one panel per workload) and against context (one per shape)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter, LogLocator
    except ImportError:
        print("plots: skipped, matplotlib is not installed (pip install matplotlib)")
        return []
    shapes = merged(reports)
    os.makedirs(folder, exist_ok=True)
    names: list[str] = []
    for s in shapes.values():
        names += [p for p in peers(s) if p not in names]
    color = {p: f"C{i}" for i, p in enumerate(names)}  # one colour per peer in every panel
    sizes = sorted(s["params"] / 1e9 for s in shapes.values())
    works = [w for w in ("single", "docs_512", "docs_2048", "docs_4096", "docs_8192", "docs_16384", "sharegpt")
             if any(w in workloads(s) for s in shapes.values())]
    fig, axes = plt.subplots(1, len(works), figsize=(3.6 * len(works), 3.8), squeeze=False)
    for ax, w in zip(axes[0], works):
        for p in names:
            pts = sorted((s["params"] / 1e9, figure(s["results"][p], w)) for s in shapes.values()
                         if p in s["results"] and figure(s["results"][p], w))
            if pts:
                ax.plot(*zip(*pts), marker="o", label=p, color=color[p])
        ax.set(xscale="log", yscale="log", xlabel="parameters (B)", title=w,
               ylabel="decode tok/s" if w == "single" else "total tok/s")
        ax.set_xticks(sizes, [f"{x:.2g}" for x in sizes])
        _log_labels(ax, LogLocator, FuncFormatter)
    axes[0][0].legend(fontsize=7)  # the same colour is the same peer in every panel
    fig.tight_layout()
    fig.tight_layout()
    paths = [os.path.join(folder, "tok_s_vs_size.png")]
    fig.savefig(paths[0], dpi=110)
    fig, axes = plt.subplots(1, len(shapes), figsize=(4.5 * len(shapes), 3.6), squeeze=False)
    for ax, (name, s) in zip(axes[0], shapes.items()):
        for p in names:
            pts = sorted((int(w.split("_")[1]), figure(s["results"][p], w)) for w in workloads(s)
                         if w.startswith("docs_") and p in s["results"] and figure(s["results"][p], w))
            if pts:
                ax.plot(*zip(*pts), marker="o", label=p, color=color[p])
        ctxs = sorted({int(w.split("_")[1]) for w in workloads(s) if w.startswith("docs_")})
        ax.set(xscale="log", yscale="log", xlabel="document tokens", ylabel="total tok/s", title=f"{name} ({s['like']})")
        ax.set_xticks(ctxs, [str(c) for c in ctxs])
        _log_labels(ax, LogLocator, FuncFormatter)
    handles = {lab: h for ax in axes[0] for h, lab in zip(*ax.get_legend_handles_labels())}
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=len(handles), fontsize=8)
    fig.tight_layout(rect=(0, 0.14, 1, 1))
    paths.append(os.path.join(folder, "tok_s_vs_context.png"))
    fig.savefig(paths[1], dpi=110)
    return paths


def _log_labels(ax: Any, locator: Any, formatter: Any) -> None:
    """Labelled ticks at 1, 2 and 5 of every decade of the log y axis; no minor ticks."""
    ax.minorticks_off()
    ax.yaxis.set_major_locator(locator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(formatter(lambda v, _: f"{v:g}"))


def print_report(reports: list[dict[str, Any]], compare_runs: bool = False) -> None:
    if compare_runs:
        print(compare(reports[0], reports[-1]))
        return
    m = reports[-1]["machine"]
    print(f"\nmachine: {m['cpu']}, {m['cpus']} CPUs, flags {' '.join(m['flags'])}\n")
    print(table(reports) + "\n\n" + efficiency(reports))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("json", nargs="+")
    p.add_argument("--plots", default=None, metavar="DIR", help="write the PNG plots there")
    p.add_argument("--compare", action="store_true", help="radixserve of the first file against the last")
    args = p.parse_args()
    reports = []
    for path in args.json:
        with open(path) as f:
            reports.append(json.load(f))
    print_report(reports, args.compare)
    for path in plots(reports, args.plots) if args.plots else []:
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
