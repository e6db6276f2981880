"""What a quantized KV pool (``--kv-cache-dtype``) costs in accuracy and buys in capacity and speed.

Accuracy: per text (ShareGPT prompt and reply as one text of 300-1,000 tokens) the argmax next
token at every position from ``--start`` on, teacher-forced (``logprob_start_len`` +
``top_logprobs_num=1``), by an engine with the exact pool (the model's dtype) and by one with the
pool in each form; agreement = share of positions with the same argmax.  Every key and value of
the text goes through the pool's form (the prompt's own tokens included: attention reads them back
from the pool), so this is the whole loss.  The bar for offering a form is 97% at the lower end of
the one-sided 95% Wilson interval, as for weights (``worker/tuning/quant_accuracy.py``).

Capacity: the tokens 1 GB of pool holds in each form.  Speed: ``--batch`` requests of the texts'
lengths prefilled together (prompt tokens per second), then decoding ``--decode`` tokens each
(greedy, ignore_eos), tokens per second, and the KV bytes
the decode steps read per second (every step reads each request's whole context once, in the
pool's bytes per token: the memory-bound part that a smaller form shrinks).

    python -m benchmarks.bench_kv_cache_dtype [--dtypes float32 auto] [--texts 24]
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time

from benchmarks.bench_kv_tier_agreement import argmaxes, texts
from radixserve.worker.tuning.quant_accuracy import BAR, lower_bound

KINDS = ("auto", "bf16", "int8", "fp8_e4m3", "fp8_e5m2")


def agreement(eng, seqs: list[list[int]], start: int, exact: list[list[int]]) -> tuple[int, int]:
    same = total = 0
    for ids, want in zip(seqs, exact):
        got = argmaxes(eng, ids, start)[0]
        eng.flush_cache()
        same += sum(a == b for a, b in zip(got, want))
        total += len(want)
    return same, total


def speed(eng, seqs: list[list[int]], batch: int, decode: int) -> tuple[float, float, float]:
    """(prompt tokens per second of prefilling ``batch`` texts, output tokens per second of their
    decoding together, KV GB read per second by the decode steps)."""
    prompts = [seqs[i % len(seqs)] + [i] for i in range(batch)]  # distinct: no prefix shared across the batch
    params = {"max_new_tokens": decode, "temperature": 0, "ignore_eos": True}
    t0 = time.perf_counter()
    eng.generate(input_ids=prompts, sampling_params={**params, "max_new_tokens": 1})  # prefill, then cached
    prefill = sum(map(len, prompts)) / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    eng.generate(input_ids=prompts, sampling_params=params)
    dt = time.perf_counter() - t0
    eng.flush_cache()
    ctx = sum(len(p) for p in prompts) * decode + batch * decode * decode / 2  # keys read over the steps
    return prefill, batch * decode / dt, ctx * eng.info.kv_bytes_per_slot / dt / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "auto"])
    ap.add_argument("--kinds", nargs="+", default=list(KINDS))
    ap.add_argument("--texts", type=int, default=24)
    ap.add_argument("--start", type=int, default=16, help="first position whose prediction counts")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--attention-backend", default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    args = ap.parse_args()
    from radixserve import Engine
    from radixserve.worker.tuning import kv_accuracy

    # measure every form, those the runtime refuses for this model too (that refusal is what this reports)
    kv_accuracy.check_pool_form = lambda *a, **k: None

    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((ln.split(":", 1)[1].strip() for ln in lscpu.splitlines() if ln.startswith("Model name")), "?")
    print(f"machine: {model} ({platform.machine()}); amx: {'amx_tile' in lscpu}, avx512_bf16: {'avx512_bf16' in lscpu}")
    print("| model dtype | kv_cache_dtype | agreement | lower bound | offered | tokens per GB | prefill tok/s "
          "| decode tok/s | KV GB/s |")
    print("|---|---|---:|---:|---|---:|---:|---:|---:|")
    rows, seqs = [], []
    for dtype in args.dtypes:
        exact: list[list[int]] = []
        for kind in args.kinds:
            eng = Engine(dtype=dtype, kv_cache_dtype=kind, max_total_tokens=32768,
                         attention_backend=args.attention_backend)
            seqs = seqs or texts(eng.tokenizer, args.texts, args.seed)
            if kind == "auto":
                exact = [argmaxes(eng, ids, args.start)[0] for ids in seqs]
                eng.flush_cache()
            same, total = agreement(eng, seqs, args.start, exact)
            pre, tps, gbs = speed(eng, seqs, args.batch, args.decode)
            rate = same / max(1, total)
            r = {"dtype": dtype, "model_dtype": str(eng.info.dtype), "kind": kind, "agreement": rate,
                 "positions": total, "lower_bound": lower_bound(rate, total),
                 "offered": lower_bound(rate, total) >= BAR, "tokens_per_gb": 1e9 / eng.info.kv_bytes_per_slot,
                 "prefill_tok_s": pre, "decode_tok_s": tps, "kv_gb_s": gbs, "backend": eng.runner.backend.name}
            eng.shutdown()
            rows.append(r)
            print(f"| {dtype} ({r['model_dtype'].removeprefix('torch.')}) | {kind} | {100 * rate:.2f}% of {total} | "
                  f"{100 * r['lower_bound']:.2f}% | {'yes' if r['offered'] else 'no'} | {r['tokens_per_gb']:,.0f} | "
                  f"{pre:,.0f} | {tps:,.1f} | {gbs:.2f} |", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"machine": model, "args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
