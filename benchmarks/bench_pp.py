"""Pipeline parallelism vs one process: the same greedy batch through the Engine per configuration.

Configurations: ``pp=1`` (all cores), ``pp=1`` on one thread (what one stage's core can do
alone), then ``pp=2`` with each ``--micro-batches`` count.  Each: an Engine (fp32,
``--quantization none``), a warm-up request, then ``--batch`` random-token prompts of
``--prompt-len`` tokens generating ``--output-len`` tokens each (greedy, ``ignore_eos``) in one
``generate`` call, timed with ``time.perf_counter``.  Prints seconds, output tokens per second,
whether the outputs are identical to the first configuration's, and for ``pp > 1`` each stage's
counters over the timed call (``RADIXSERVE_PP_STATS``, ``worker/pp/runner.py``): steps,
micro-batches, seconds inside steps, of which blocked in receives/sends (waiting for the other
stage: the bubble plus the transfers), and that share of the step time.  The ideal idle share of
a GPipe forward with ``S`` stages and ``M`` micro-batches of equal cost is ``(S - 1) / (M + S - 1)``.

    .venv/bin/python -m benchmarks.bench_pp --micro-batches 1 2 4
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from typing import Any, Optional

import numpy as np

from benchmarks.bench_tp import batch_args


def _stats(folder: str) -> dict[int, dict[str, Any]]:
    out = {}
    for name in os.listdir(folder):
        if name.endswith(".json"):
            with open(os.path.join(folder, name)) as f:
                s = json.load(f)
            out[s["rank"]] = s
    return out


def _run(args: argparse.Namespace, prompts: list, pp: int, micro: int,
         threads: Optional[int] = None) -> tuple[float, list, dict]:
    import torch

    from radixserve import Engine

    folder = tempfile.mkdtemp(prefix="bench-pp-")
    os.environ["RADIXSERVE_PP_STATS"] = folder  # inherited by the stages' processes
    sp = {"max_new_tokens": args.output_len, "temperature": 0, "ignore_eos": True}
    with Engine(args.model, dtype=args.dtype, quantization="none", max_total_tokens=16384, pp_size=pp,
                pp_micro_batches=micro) as eng:
        before_threads = torch.get_num_threads()
        if threads:
            torch.set_num_threads(threads)
        eng.generate(input_ids=[1, 2, 3, 4], sampling_params={"max_new_tokens": 4})
        before = _stats(folder)
        t0 = time.perf_counter()
        outs = eng.generate(input_ids=prompts, sampling_params=sp)
        dt = time.perf_counter() - t0
        time.sleep(0.5)  # the stages write their counters after each step
        after = _stats(folder)
        torch.set_num_threads(before_threads)
    delta = {r: {k: after[r][k] - before.get(r, {}).get(k, 0) for k in ("steps", "micro_batches", "step_s", "wait_s")}
             | {"stage": after[r]["stage"]} for r in after}
    return dt, [o["output_ids"] for o in outs], delta


def main() -> None:
    ap = argparse.ArgumentParser()
    batch_args(ap)
    ap.add_argument("--pp-size", type=int, default=2)
    ap.add_argument("--micro-batches", type=int, nargs="+", default=[1, 2, 4])
    args = ap.parse_args()

    rng = np.random.default_rng(args.seed)
    prompts = rng.integers(100, 40000, size=(args.batch, args.prompt_len)).tolist()
    configs = [("pp=1", 1, 0, None), ("pp=1, 1 thread", 1, 0, 1)]
    configs += [(f"pp={args.pp_size}, {m} micro-batch{'es' if m > 1 else ''}", args.pp_size, m, None)
                for m in args.micro_batches]
    first = None
    for label, pp, micro, threads in configs:
        dt, ids, stats = _run(args, prompts, pp, micro, threads)
        first = first or ids
        n = sum(len(i) for i in ids)
        print(f"{label}: {dt:.2f} s, {n / dt:.1f} output tok/s, outputs identical to pp=1: {ids == first}", flush=True)
        if pp > 1:
            ideal = (pp - 1) / (micro + pp - 1)
            for r, s in sorted(stats.items()):
                busy = s["step_s"] - s["wait_s"]
                print(f"    stage {s['stage']} (rank {r}): {s['steps']} steps, {s['micro_batches']} micro-batches, "
                      f"{s['step_s']:.2f} s in steps, {s['wait_s']:.2f} s waiting "
                      f"({s['wait_s'] / max(s['step_s'], 1e-9):.0%}; ideal bubble {ideal:.0%}), {busy:.2f} s computing",
                      flush=True)


if __name__ == "__main__":
    main()
