"""KV memory of Gemma 3 at 8k context with and without the sliding-window pool.

Part 1 (arithmetic, from the published configs' shapes): KV bytes per 8k-token request for
Gemma 3 1B/4B/12B/27B, one pool for every layer against full layers for every token plus
sliding layers for one window and one prefill chunk (what a running request holds in the
sliding pool at most).  Part 2 (measured): a Gemma-3-shaped random checkpoint (4B's head shape
and window, its 5:1 sliding:full pattern, fewer layers) serves ``--requests`` concurrent
``--context``-token prompts in a pool sized for them, once with one pool and once with the
sliding pool at its floor; prints each pool's bytes, the sliding slots in use at their peak,
the wall time, and whether the greedy tokens agree.

    .venv/bin/python -m benchmarks.bench_swa_memory                    # bf16, 2 x 8192 tokens
"""
from __future__ import annotations

import argparse
import tempfile
import threading
import time

import torch

from benchmarks.peers_report import machine

# (layers, kv heads, head_dim, window, sliding:full) of the published Gemma 3 text configs
SHAPES = {"gemma-3-1b": (26, 1, 256, 512, 5), "gemma-3-4b": (34, 4, 256, 1024, 5),
          "gemma-3-12b": (48, 8, 256, 1024, 5), "gemma-3-27b": (62, 16, 128, 1024, 5)}


def arithmetic(context: int, chunk: int, dtype_bytes: int = 2) -> list[str]:
    rows = ["| model | layers (sliding) | one pool, MB / request | sliding pool, MB / request | saved |",
            "|---|---|---|---|---|"]
    for name, (layers, kv, dim, window, ratio) in SHAPES.items():
        full_layers = sum(1 for i in range(layers) if (i + 1) % (ratio + 1) == 0)
        sliding = layers - full_layers
        per_layer_token = 2 * kv * dim * dtype_bytes
        one = layers * context * per_layer_token
        hybrid = (full_layers * context + sliding * min(context, window + chunk)) * per_layer_token
        rows.append(f"| {name} | {layers} ({sliding}) | {one / 2**20:.0f} | {hybrid / 2**20:.0f} | "
                    f"{100 * (1 - hybrid / one):.0f}% |")
    return rows


def build(path: str, layers: int) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, Gemma3TextConfig

    from radixserve.model.loader import resolve_hf_dir

    types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(layers)]
    cfg = Gemma3TextConfig(vocab_size=49152, hidden_size=640, intermediate_size=2048, num_hidden_layers=layers,
                           num_attention_heads=8, num_key_value_heads=4, head_dim=256, query_pre_attn_scalar=256,
                           sliding_window=1024, layer_types=types, max_position_embeddings=32768,
                           tie_word_embeddings=True)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(path)
    AutoTokenizer.from_pretrained(resolve_hf_dir(None)).save_pretrained(path)


def serve(path: str, prompts: list[list[int]], hybrid: bool, args) -> dict:
    from radixserve import Engine

    total = sum(len(p) for p in prompts) + 64 * len(prompts)
    eng = Engine(path, dtype=args.dtype, max_total_tokens=total, chunked_prefill_size=args.chunk,
                 context_length=args.context + 128, disable_hybrid_swa_memory=not hybrid,
                 swa_full_tokens_ratio=0.01, max_running_requests=len(prompts))
    pool = eng.run_on_driver(lambda s: s.worker.kv_pool if hasattr(s.worker, "kv_pool") else None, 30)
    peak, stop = [0], threading.Event()

    def watch() -> None:
        while not stop.is_set():
            s = eng.stats()
            if "sliding_num_slots" in s:
                peak[0] = max(peak[0], s["sliding_num_slots"] - s["sliding_free_slots"])
            time.sleep(0.05)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    start = time.perf_counter()
    out = eng.generate(input_ids=prompts, sampling_params={"max_new_tokens": 8, "temperature": 0})
    wall = time.perf_counter() - start
    stop.set()
    t.join()
    s = eng.stats()
    eng.shutdown()
    return {"bytes": pool.total_bytes if pool is not None else None, "sliding": s.get("sliding_num_slots", 0),
            "full": s["num_slots"], "peak": peak[0], "wall": wall, "tokens": [o["output_ids"] for o in out]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--context", type=int, default=8192)
    p.add_argument("--requests", type=int, default=2)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--chunk", type=int, default=2048)
    p.add_argument("--dtype", default="bfloat16")
    args = p.parse_args()
    m = machine()
    print(f"machine: {m['cpu']}, {m['cpus']} CPUs, flags {' '.join(m['flags'])}; torch {torch.__version__}")
    print(f"\n## Arithmetic: KV per {args.context}-token request (bf16, prefill chunk {args.chunk})\n")
    print("\n".join(arithmetic(args.context, args.chunk)))
    print(f"\n## Measured: {args.requests} x {args.context} tokens, Gemma-3-4B heads and window, "
          f"{args.layers} layers, {args.dtype}\n")
    with tempfile.TemporaryDirectory() as path:
        build(path, args.layers)
        g = torch.Generator().manual_seed(1)
        prompts = [torch.randint(100, 49000, (args.context,), generator=g).tolist() for _ in range(args.requests)]
        runs = {name: serve(path, prompts, name == "sliding pool", args) for name in ("one pool", "sliding pool")}
    print("| pool | full slots | sliding slots | sliding slots in use at peak | KV bytes (MB) | wall s |")
    print("|---|---|---|---|---|---|")
    for name, r in runs.items():
        mb = f"{r['bytes'] / 2**20:.1f}" if r["bytes"] else "?"
        print(f"| {name} | {r['full']} | {r['sliding'] or '-'} | {r['peak'] or '-'} | {mb} | {r['wall']:.1f} |")
    a, b = runs["one pool"], runs["sliding pool"]
    if a["bytes"] and b["bytes"]:
        print(f"\nKV memory saved: {100 * (1 - b['bytes'] / a['bytes']):.1f}%; greedy tokens equal: "
              f"{a['tokens'] == b['tokens']}")


if __name__ == "__main__":
    main()
