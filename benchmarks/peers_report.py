"""Printing bench_peers.py's results: the machine, one table of figures per peer, the ratios,
the roofline and the decode bandwidth."""
from __future__ import annotations

import os
import re
from typing import Any, Callable, Optional

RELEVANT_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile",
                  "amx_bf16", "amx_int8")
Row = tuple[str, Callable[[dict[str, Any]], Optional[float]], str]

ROWS: list[Row] = [
    ("single-stream decode tok/s", lambda r: r.get("single", {}).get("decode_tok_s"), "{:.1f}"),
    ("single-stream e2e tok/s", lambda r: r.get("single", {}).get("e2e_tok_s"), "{:.1f}"),
    ("shared-prefix total tok/s", lambda r: r.get("shared_prefix", {}).get("total_tok_s"), "{:.1f}"),
    ("shared-prefix wall s", lambda r: r.get("shared_prefix", {}).get("time_s"), "{:.2f}"),
    ("shared-prefix hit rate", lambda r: r.get("shared_prefix", {}).get("hit_rate"), "{:.1%}"),
    ("sharegpt total tok/s", lambda r: r.get("sharegpt", {}).get("total_tok_s"), "{:.1f}"),
    ("sharegpt wall s", lambda r: r.get("sharegpt", {}).get("time_s"), "{:.2f}"),
    ("sharegpt hit rate", lambda r: r.get("sharegpt", {}).get("hit_rate"), "{:.1%}"),
]
RATIO_ROWS = ("single-stream decode tok/s", "shared-prefix total tok/s", "sharegpt total tok/s")


def machine() -> dict[str, Any]:
    """CPU model name (as lscpu shows it), the SIMD/AMX flags that matter here, core count and
    load average."""
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        text = ""
    model = re.search(r"^model name\s*:\s*(.*)$", text, re.M)
    flags = re.search(r"^flags\s*:\s*(.*)$", text, re.M)
    have = set(flags.group(1).split()) if flags else set()
    return {"cpu": model.group(1).strip() if model else "?", "cpus": os.cpu_count(),
            "flags": [f for f in RELEVANT_FLAGS if f in have], "loadavg": list(os.getloadavg())}


def _cell(value: Optional[float], fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def _marks(res: dict[str, Any]) -> str:
    return " [HF EXTRAPOLATED]" if any(res.get(w, {}).get("extrapolated") for w in ("shared_prefix", "sharegpt")) \
        else ""


def print_table(results: dict[str, dict[str, Any]], agreement: dict[str, dict[str, str]]) -> None:
    """One column per peer, one row per figure."""
    names = list(results)
    width = max(14, *(len(n) + 2 for n in names))
    print("\n" + " " * 32 + "".join(f"{n:>{width}}" for n in names))
    for label, get, fmt in ROWS:
        print(f"{label:<32}" + "".join(f"{_cell(get(results[n]), fmt):>{width}}" for n in names))
    for w in ("shared_prefix", "sharegpt"):
        cells = [agreement.get(n, {}).get(w, "-") for n in names]
        print(f"{'same greedy ids as ours, ' + w.split('_')[0]:<32}" + "".join(f"{c:>{width}}" for c in cells))
    for n in names:
        if _marks(results[n]):
            ex = [f"{w}: {results[n][w]['batches_timed']}/{results[n][w]['batches_total']} batches timed"
                  for w in ("shared_prefix", "sharegpt") if results[n].get(w, {}).get("extrapolated")]
            print(f"{n}: EXTRAPOLATED ({'; '.join(ex)}, time scaled linearly)")


def print_ratios(results: dict[str, dict[str, Any]], ours: str, hf: Optional[str]) -> None:
    """Each peer / HF, and ours / each peer, on the rate figures."""
    rows = [r for r in ROWS if r[0] in RATIO_ROWS]
    pairs = [(f"{n} / {hf}", n, hf) for n in results if hf and n not in (hf, ours)] + \
            [(f"{ours} / {n}", ours, n) for n in results if n != ours]
    if not pairs:
        return
    print("\nratios" + " " * 26 + "".join(f"{label[:26]:>28}" for label, _, _ in rows))
    for name, a, b in pairs:
        cells = []
        for _, get, _ in rows:
            x, y = get(results[a]), get(results[b])
            cells.append("-" if not x or not y else f"{x / y:.2f}x")
        note = " (HF extrapolated)" if hf in (a, b) and _marks(results[hf]) else ""
        print(f"{name:<32}" + "".join(f"{c:>28}" for c in cells) + note)


def print_gemm(gemm: dict[str, dict[str, float]], m: int) -> None:
    print(f"peak GEMM: F.linear, M={m}, on the model's layer shapes, best of 10 rounds (GFLOP/s):")
    for dt, rates in gemm.items():
        print(f"  {dt:<9}" + "  ".join(f"{k} {v:.0f}" for k, v in rates.items() if k != "peak")
              + f"  -> peak {rates['peak']:.0f}")


def print_roofline(roof: dict[str, Any]) -> None:
    f = roof["flops"]
    print(f"\n== roofline: {roof['peer']} shared-prefix run, dtype {roof['dtype']}")
    print(f"token passes = prompt {roof['prompt_tokens']} - cached {roof['cached_tokens']} + decode passes "
          f"{f['token_passes'] - roof['prompt_tokens'] + roof['cached_tokens']} (output - 1 per request) "
          f"= {f['token_passes']}")
    print(f"FLOP: linear 2 x {roof['layers']} layers x {roof['layer_params']:,} params x passes = "
          f"{f['linear_flop'] / 1e12:.2f} T; LM head 2 x {roof['lm_head_params']:,} x {f['sampled_rows']} sampled rows "
          f"= {f['lm_head_flop'] / 1e12:.3f} T; attention 4 x L x heads x head_dim x {f['attended_keys']:,} keys = "
          f"{f['attention_flop'] / 1e12:.2f} T; total {f['total_flop'] / 1e12:.2f} TFLOP")
    print(f"achieved {roof['achieved_gflops']:.0f} GFLOP/s over {roof['time_s']:.2f} s = "
          f"{roof['pct_of_peak']:.1%} of the {roof['dtype']} peak ({roof['peak_gflops']:.0f} GFLOP/s)")


def print_bandwidth(rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    print("\n== single-stream decode, gpt-fast style: bytes read per step x decode tok/s")
    for r in rows:
        print(f"{r['peer']:<22} {r['weights']:<34} {r['step_bytes'] / 1e6:8.1f} MB/step x {r['tok_s']:7.1f} tok/s "
              f"= {r['gb_s']:6.1f} GB/s")
