"""Profile decode steps: where a step's time goes at a given batch size, by op.

``--batch`` requests of ``--prompt-len`` random tokens go to the Engine in one call with
``--steps + 1`` output tokens (greedy, EOS ignored).  The first model step (the prefill) is
skipped; the next ``--steps`` steps, where every request computes one token, run under
``torch.profiler``.  Prints the wall time per decode step, the profiled self time per step,
the share outside every op (Python, the scheduler), and the top ops by self time, as in the
tables of benchmarks/README.md.

    .venv/bin/python -m benchmarks.profile_decode --batch 1
    .venv/bin/python -m benchmarks.profile_decode --batch 64 --dtype auto --top 8
"""
from __future__ import annotations

import argparse
import time

import torch

from benchmarks.workloads import random_prompts

from radixserve import Engine
from radixserve.worker import model_runner


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--quantization", default="auto")
    p.add_argument("--top", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    eng = Engine(args.model, dtype=args.dtype, quantization=args.quantization,
                 max_total_tokens=args.batch * (args.prompt_len + args.steps + 2) + 1024)
    vocab = eng.runner.vocab_size
    sp = {"max_new_tokens": args.steps + 1, "temperature": 0, "ignore_eos": True}
    eng.generate(input_ids=random_prompts(args.batch, args.prompt_len, vocab, args.seed + 99), sampling_params=sp)
    eng.flush_cache()  # the warm-up above built oneDNN's kernels; its cache entries count for nothing

    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                  schedule=torch.profiler.schedule(wait=1, warmup=0, active=args.steps, repeat=1))
    walls: list[float] = []
    step = model_runner.ModelRunner.step

    def timed(self, plan):
        t = time.perf_counter()
        out = step(self, plan)
        walls.append(time.perf_counter() - t)
        prof.step()
        return out

    model_runner.ModelRunner.step = timed
    with prof:
        eng.generate(input_ids=random_prompts(args.batch, args.prompt_len, vocab, args.seed), sampling_params=sp)
    model_runner.ModelRunner.step = step
    decode = walls[1: 1 + args.steps]
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events)
    # ProfilerStep's own time is the step's time outside every op: Python and the scheduler
    outside = sum(e.self_cpu_time_total for e in events if e.key.startswith("ProfilerStep"))
    events = [e for e in events if not e.key.startswith("ProfilerStep")]
    print(f"numerics {eng.runner.numerics.describe()}; batch {args.batch}, prompt {args.prompt_len}, "
          f"{len(decode)} decode steps profiled")
    print(f"wall per decode step {1e3 * sum(decode) / len(decode):.1f} ms (profiler on); "
          f"profiled self time per step {total / 1e3 / len(decode):.1f} ms, of which "
          f"{outside / 1e3 / len(decode):.1f} ms ({100 * outside / total:.0f}%) outside any op (Python)")
    print(f"| op | self % | ms per step | calls per step |\n|---|---:|---:|---:|")
    for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[: args.top]:
        print(f"| {e.key} | {100 * e.self_cpu_time_total / total:.1f} | "
              f"{e.self_cpu_time_total / 1e3 / len(decode):.2f} | {e.count / len(decode):.0f} |")
    eng.shutdown()


if __name__ == "__main__":
    main()
