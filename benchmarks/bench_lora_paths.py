"""The two LoRA paths of ``radixserve/worker/lora/step.py`` on one layer of SmolLM2-135M's shapes:
the native segmented kernel (``lora_sgmv_``) and the stacked GEMMs (``x @ A^T``, mask, ``@ B``), and
per-slot gathered GEMMs for reference; bf16, rank 8, 4 slots, rows spread over the slots, best of
20 calls, microseconds.  ``worker/lora/timing.py`` measures the same choice at startup.

    .venv/bin/python -m benchmarks.bench_lora_paths
"""
from __future__ import annotations

import itertools
import time

import torch

from radixserve.kernels import cpu_native

S, R = 4, 8


def bench(fn, reps: int = 20) -> float:
    fn()
    best = 1e9
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e6


def main() -> None:
    if not cpu_native.load():
        print("the native CPU kernels are not built: skipped")
        return
    torch.manual_seed(0)
    dt = torch.bfloat16
    for name, k, outs in (("qkv", 576, (576, 192, 192)), ("gate_up", 576, (1536, 1536)), ("down", 1536, (576,))):
        parts, n = len(outs), sum(outs)
        width = parts * R
        a = torch.randn(S * width, k, dtype=dt) * 0.02
        b = torch.zeros(S * width, n, dtype=dt)  # each part's rows nonzero only in its own columns
        cols = [0, *itertools.accumulate(outs)]
        for s in range(S):
            for p in range(parts):
                rows_p = slice((s * parts + p) * R, (s * parts + p + 1) * R)
                b[rows_p, cols[p]:cols[p + 1]] = torch.randn(R, outs[p]) * 0.02
        for t in (32, 128, 512, 4096):
            x, y = torch.randn(t, k, dtype=dt), torch.randn(t, n, dtype=dt)
            row_slot = torch.arange(t) % S
            order = torch.argsort(row_slot, stable=True)
            seg, cnt = torch.unique_consecutive(row_slot[order], return_counts=True)
            bounds = torch.cat([cnt.new_zeros(1), torch.cumsum(cnt, 0)])
            mask = ((torch.arange(S * width) // width).unsqueeze(0) == row_slot.unsqueeze(1)).to(dt)
            groups = [(s, order[bounds[i]:bounds[i + 1]]) for i, s in enumerate(seg.tolist())]

            def kernel() -> None:
                torch.ops.radixserve_cpu.lora_sgmv_(y, x, a, b, order, bounds, seg, parts, R, torch.tensor(cols))

            def stacked() -> None:
                m = torch.mm(x, a.t())
                m.mul_(mask)
                y.addmm_(m, b)

            def gathered() -> None:
                for s, r in groups:
                    m = torch.mm(x.index_select(0, r), a[s * width:(s + 1) * width].t())
                    y.index_add_(0, r, torch.mm(m, b[s * width:(s + 1) * width]))

            flops = 2 * t * (k * width + n * R)
            u1, u2, u3 = bench(kernel), bench(stacked), bench(gathered)
            print(f"{name:8s} rows {t:5d}: kernel {u1:8.1f} us ({flops / u1 / 1e3:5.1f} GFLOP/s), stacked GEMMs "
                  f"{u2:8.1f} us, per-slot gathered GEMMs {u3:8.1f} us", flush=True)


if __name__ == "__main__":
    main()
