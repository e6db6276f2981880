"""Tensor parallelism vs one rank: the same greedy batch through the Engine at each tp size.

For each ``--tp-sizes`` value: an Engine (fp32 by default, ``--quantization none``), a warm-up
request, then ``--batch`` random-token prompts of ``--prompt-len`` tokens generating
``--output-len`` tokens each (greedy, ``ignore_eos``) in one ``generate`` call, timed with
``time.perf_counter``.  Prints seconds, output tokens per second and whether the outputs are
identical to the first tp size's.  The ranks of tp > 1 share this machine's cores.

    .venv/bin/python -m benchmarks.bench_tp --tp-sizes 1 2
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def batch_args(ap: argparse.ArgumentParser) -> None:
    """The batch both parallelism benchmarks time (this one and ``bench_pp``): model, dtype, and
    ``--batch`` random prompts of ``--prompt-len`` tokens generating ``--output-len`` each."""
    ap.add_argument("--model", default=None)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)


def main() -> None:
    ap = argparse.ArgumentParser()
    batch_args(ap)
    ap.add_argument("--tp-sizes", type=int, nargs="+", default=[1, 2])
    args = ap.parse_args()
    from radixserve import Engine

    rng = np.random.default_rng(args.seed)
    prompts = rng.integers(100, 40000, size=(args.batch, args.prompt_len)).tolist()
    sp = {"max_new_tokens": args.output_len, "temperature": 0, "ignore_eos": True}
    first = None
    for tp in args.tp_sizes:
        with Engine(args.model, dtype=args.dtype, quantization="none", max_total_tokens=16384, tp_size=tp) as eng:
            eng.generate(input_ids=[1, 2, 3, 4], sampling_params={"max_new_tokens": 4})
            t0 = time.perf_counter()
            outs = eng.generate(input_ids=prompts, sampling_params=sp)
            dt = time.perf_counter() - t0
        ids = [o["output_ids"] for o in outs]
        first = first or ids
        n = sum(len(i) for i in ids)
        print(f"tp={tp}: {dt:.2f} s, {n / dt:.1f} output tok/s, outputs identical to tp={args.tp_sizes[0]}: "
              f"{ids == first}", flush=True)


if __name__ == "__main__":
    main()
