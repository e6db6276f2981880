"""Offline throughput on the generated-shared-prefix workload, against HF ``generate``.

Workload (defaults): 16 groups x 8 prompts = 128 requests.  Each group has its own
512-token "system prompt"; each prompt appends its own 64-token "question"; every request
generates exactly 64 tokens (greedy, ``ignore_eos``).  Token ids are random, drawn from
[100, vocab - 100) with ``numpy.random.default_rng(seed)``, so the run needs no data set
and tokenization plays no part.  A perfect prefix cache can reuse 7 of every 8 system
prompts: the best possible hit rate is 7 * 512 / 576 / 8 = 77.8% of the prompt tokens.

After a short warm-up on unrelated prompts (then ``flush_cache()`` so it counts for
nothing), all 128 requests go to the Engine in ONE ``generate(input_ids=...)`` call, timed
with ``time.perf_counter``.  The same prompts then go through Hugging Face transformers
``generate`` (fp32, batches of ``--hf-batch-size``, ``do_sample=False``,
``min_new_tokens = max_new_tokens`` so that it also makes every token).  With
``--hf-max-batches N`` only the first N HF batches run and the HF time is EXTRAPOLATED
linearly to the whole workload; the output says so and ``--json-out`` records it.

Run from the repository root (the default model is SmolLM2-135M-Instruct):

    .venv/bin/python -m benchmarks.bench_offline                       # full run + HF baseline
    .venv/bin/python -m benchmarks.bench_offline --disable-radix-cache --no-hf-baseline
    .venv/bin/python -m benchmarks.bench_offline --no-hf-baseline --quantization int4
    .venv/bin/python -m benchmarks.bench_offline --groups 2 --prompts-per-group 2 \\
        --system-len 64 --question-len 16 --output-len 8 --hf-max-batches 1   # smoke test
"""
from __future__ import annotations

import argparse
import gc
import json
from typing import Any

from benchmarks.hf_baseline import HFPeer
from benchmarks.peer_runners.common import batch_workload
from benchmarks.radix_peer import RadixPeer
from benchmarks.workloads import add_shared_prefix_args, random_prompts, shared_prefix_prompts, workload_line

from radixserve import Engine


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="HF directory or .gguf (default: SmolLM2-135M-Instruct)")
    add_shared_prefix_args(p)
    p.add_argument("--dtype", default="auto", help="our engine's dtype (the HF baseline is always fp32)")
    p.add_argument("--quantization", default="auto", choices=["auto", "none", "int8", "w8a8", "int4"],
                   help="our engine's linear layers (auto: chosen with --dtype auto by measurement)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-total-tokens", type=int, default=None,
                   help="KV pool size; default: every token of the workload fits, so nothing is evicted")
    p.add_argument("--chunked-prefill-size", type=int, default=None, help="default: the Engine's")
    p.add_argument("--schedule-policy", choices=["lpm", "fcfs"], default=None, help="default: the Engine's")
    p.add_argument("--disable-radix-cache", action="store_true")
    p.add_argument("--hf-baseline", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--hf-batch-size", type=int, default=16)
    p.add_argument("--hf-max-batches", type=int, default=None,
                   help="time only the first N HF batches and extrapolate to the whole workload")
    p.add_argument("--json-out", default=None, metavar="PATH")
    args = p.parse_args()
    if args.hf_max_batches is not None and args.hf_max_batches < 1:
        p.error("--hf-max-batches must be >= 1")
    return args


def default_pool(args: argparse.Namespace, n: int) -> int:
    """Slots for every token of the workload (shared system prompts stored once with the radix
    cache, n times without), plus 10% headroom."""
    per_req = args.question_len + args.output_len
    need = n * (args.system_len + per_req) if args.disable_radix_cache else args.groups * args.system_len + n * per_req
    return int(need * 1.1) + 256


def run_ours(args: argparse.Namespace) -> tuple[dict[str, Any], list[list[int]], list[list[int]], str]:
    kwargs: dict[str, Any] = {"dtype": args.dtype, "quantization": args.quantization,
                              "disable_radix_cache": args.disable_radix_cache}
    if args.chunked_prefill_size is not None:
        kwargs["chunked_prefill_size"] = args.chunked_prefill_size
    if args.schedule_policy is not None:
        kwargs["schedule_policy"] = args.schedule_policy
    n = args.groups * args.prompts_per_group
    kwargs["max_total_tokens"] = args.max_total_tokens or default_pool(args, n)
    engine = Engine(args.model, **kwargs)
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(engine.model_path).vocab_size
    prompts = shared_prefix_prompts(args.groups, args.prompts_per_group, args.system_len, args.question_len,
                                    vocab, args.seed)
    peer = RadixPeer(engine)
    peer.run_batch(random_prompts(4, 48, vocab, args.seed + 12345), [8] * 4)  # warm-up, unrelated ids
    res = batch_workload(peer, prompts, [args.output_len] * n)  # flushes the cache first
    outs = res.pop("outputs")
    del res["cached_per_request"], res["requests"]
    stats = engine.stats()
    res.update(max_total_tokens=kwargs["max_total_tokens"], retractions=stats.get("retractions"),
               evicted_tokens=stats.get("evicted_tokens"), numerics=engine.runner.numerics.describe())
    model_path = engine.model_path
    del engine
    gc.collect()
    return res, prompts, outs, model_path


def run_hf(args: argparse.Namespace, model_path: str, prompts: list[list[int]],
           ours_out: list[list[int]]) -> dict[str, Any]:
    """HF ``generate`` (hf_baseline.py) on the same prompts; counts outputs identical to ours."""
    peer = HFPeer(model_path, args.hf_batch_size, args.hf_max_batches)
    peer.generate_one(prompts[0][:32], 4)  # warm-up
    res = batch_workload(peer, prompts, [args.output_len] * len(prompts))
    n_done = res["requests_run"]
    res["greedy_identical"] = sum(a == b for a, b in zip(res.pop("outputs")[:n_done], ours_out))
    res["greedy_compared"] = n_done
    peer.close()
    return res


def main() -> None:
    args = parse_args()
    n = args.groups * args.prompts_per_group
    print(f"{workload_line(args)}; dtype={args.dtype} quantization={args.quantization} "
          f"radix_cache={'off' if args.disable_radix_cache else 'on'}")
    ours, prompts, ours_out, model_path = run_ours(args)
    print(f"\n== radixserve Engine ({n} requests in one generate call; {ours['numerics']})")
    print(f"wall time      : {ours['time_s']:.2f} s")
    print(f"input tok/s    : {ours['input_tok_s']:.1f}  ({ours['prompt_tokens']} prompt tokens)")
    print(f"output tok/s   : {ours['output_tok_s']:.1f}  ({ours['completion_tokens']} completion tokens)")
    print(f"total tok/s    : {ours['total_tok_s']:.1f}")
    print(f"cache hit rate : {ours['hit_rate']:.1%}  ({ours['cached_tokens']} cached / {ours['prompt_tokens']} "
          f"prompt tokens; max_total_tokens={ours['max_total_tokens']}, retractions={ours['retractions']}, "
          f"evicted_tokens={ours['evicted_tokens']})")
    result: dict[str, Any] = {"args": vars(args), "ours": ours}
    if args.hf_baseline:
        hf = run_hf(args, model_path, prompts, ours_out)
        note = (f"  [EXTRAPOLATED from {hf['batches_timed']}/{hf['batches_total']} batches, "
                f"{hf['measured_time_s']:.2f} s measured]" if hf["extrapolated"] else "")
        print(f"\n== HF transformers generate (fp32, batch {args.hf_batch_size}){note}")
        print(f"wall time      : {hf['time_s']:.2f} s")
        print(f"input tok/s    : {hf['input_tok_s']:.1f}")
        print(f"output tok/s   : {hf['output_tok_s']:.1f}")
        print(f"total tok/s    : {hf['total_tok_s']:.1f}")
        print(f"greedy outputs identical to ours: {hf['greedy_identical']}/{hf['greedy_compared']}")
        ratio = ours["total_tok_s"] / hf["total_tok_s"]
        print(f"\nspeedup ours/HF (total tok/s): {ratio:.2f}x" + (" (HF extrapolated)" if hf["extrapolated"] else ""))
        result.update(hf=hf, speedup_total=ratio)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(result, f, indent=2)
        print(f"wrote {args.json_out}")


if __name__ == "__main__":
    main()
