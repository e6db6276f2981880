"""Multi-LoRA throughput: one batch over 0, 1, 2, 4, 8 adapters against the base model.

Random PEFT adapters (``--rank``, every linear layer of every decoder layer, made once with PEFT
and cached under ``~/.cache/radixserve/bench_lora``) are served by one Engine
(``max_loras_per_batch`` = the largest count); the base figure comes from an Engine without LoRA
on the same batch.  Each run: ``--batch`` random-token prompts of ``--prompt-len`` tokens, each
generating ``--output-len`` tokens (greedy, ``ignore_eos``) in one ``generate`` call, request i
on adapter ``i % count``; the cache is flushed before each run.  Both Engines are up at once and
each of ``--repeats`` rounds times every configuration once (base, then each count), after one
untimed run of the whole batch per Engine; each figure is the best of its rounds, and the ratio
is given twice: best against best, and the median over rounds of the ratio to that round's base
run (robust to a machine whose speed drifts from round to round).  Prints
seconds, output tokens per second and the ratio to the base; ``adapters 0`` is the LoRA Engine
serving base requests only (the base path with LoRA on).

    .venv/bin/python -m benchmarks.bench_lora                     # SmolLM2-135M, rank 8, batch 32
    .venv/bin/python -m benchmarks.bench_lora --counts 4 --batch 32 --json-out /tmp/lora.json
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import time

import numpy as np


def cpu_label() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    flags = [f for f in fields.get("Flags", "").split() if f.startswith(("avx512", "amx", "avx2"))]
    return f"{fields.get('Model name', '?').strip()}; {' '.join(flags)}"


def make_adapters(hf_dir: str, rank: int, count: int) -> list[str]:
    """``count`` random rank-``rank`` adapters of ``hf_dir`` (made once, then reused)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from radixserve.model.loader import cache_root

    root = os.path.join(cache_root(), "bench_lora", f"{os.path.basename(hf_dir.rstrip('/'))}-r{rank}")
    paths = [os.path.join(root, f"adapter{i}") for i in range(count)]
    for i, path in enumerate(paths):
        if os.path.exists(os.path.join(path, "adapter_config.json")):
            continue
        base = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
        cfg = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                                       "gate_proj", "up_proj", "down_proj"],
                         lora_dropout=0.0, task_type="CAUSAL_LM")
        model = get_peft_model(base, cfg)
        g = torch.Generator().manual_seed(i)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_" in name:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.02)
        model.save_pretrained(path)
    return paths


def timed(eng, prompts: list[list[int]], sp: dict, names: list, repeats: int) -> tuple[float, int]:
    best, n = float("inf"), 0
    for _ in range(repeats):
        eng.flush_cache()
        t0 = time.perf_counter()
        outs = eng.generate(input_ids=prompts, sampling_params=sp, lora_path=names)
        best = min(best, time.perf_counter() - t0)
        n = sum(len(o["output_ids"]) for o in outs)
    return best, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--counts", type=int, nargs="+", default=[0, 1, 2, 4, 8])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json-out", default=None)
    a = ap.parse_args()
    from radixserve import Engine
    from radixserve.model.loader import resolve_hf_dir

    hf_dir = resolve_hf_dir(a.model)
    most = max(max(a.counts), 1)
    paths = make_adapters(hf_dir, a.rank, most)
    rng = np.random.default_rng(a.seed)
    prompts = rng.integers(100, 40000, size=(a.batch, a.prompt_len)).tolist()
    sp = {"max_new_tokens": a.output_len, "temperature": 0, "ignore_eos": True}
    kw = dict(dtype=a.dtype, max_total_tokens=a.batch * (a.prompt_len + a.output_len) + 1024)
    print(f"CPU: {cpu_label()}; torch threads {__import__('torch').get_num_threads()}", flush=True)
    lora_paths = tuple(f"adapter{i}={p}" for i, p in enumerate(paths))
    names = {count: [None if count == 0 else f"adapter{i % count}" for i in range(a.batch)] for count in a.counts}
    best: dict = {}
    n = 0
    # both Engines live side by side and the rounds interleave them, so that a drift of the
    # machine's speed (a shared VM) lands on every configuration alike
    with Engine(a.model, **kw) as base, Engine(a.model, lora_paths=lora_paths, max_loras_per_batch=most, **kw) as eng:
        timed(base, prompts, sp, [None] * a.batch, 1)  # warm-up: the step shapes of the timed runs
        timed(eng, prompts, sp, [f"adapter{i % most}" for i in range(a.batch)], 1)  # warm-up, every slot
        dtype, quant = base.info.dtype, base.info.quantization
        for _ in range(a.repeats):
            s, n = timed(base, prompts, sp, [None] * a.batch, 1)
            best.setdefault("base", []).append(s)
            for count in a.counts:
                s, n = timed(eng, prompts, sp, names[count], 1)
                best.setdefault(count, []).append(s)
    # the per-round ratio pairs each run with the base run of its own round (seconds apart)
    paired = {k: float(np.median([b / t for b, t in zip(best["base"], v)])) for k, v in best.items()}
    spread = {k: f"rounds {min(v):.2f}-{max(v):.2f} s" for k, v in best.items()}
    best = {k: min(v) for k, v in best.items()}
    base_s = best["base"]
    print(f"base (no LoRA): {base_s:.2f} s, {n / base_s:.1f} output tok/s ({dtype}, {quant}; {spread['base']})",
          flush=True)
    rows = [{"adapters": "base", "seconds": base_s, "tok_s": n / base_s, "ratio": 1.0}]
    for count in a.counts:
        s = best[count]
        rows.append({"adapters": count, "seconds": s, "tok_s": n / s, "ratio": base_s / s,
                     "paired_ratio": paired[count]})
        print(f"adapters {count}: {s:.2f} s, {n / s:.1f} output tok/s, {base_s / s:.1%} of the base's best; "
              f"median of the rounds' ratios {paired[count]:.1%} ({spread[count]})", flush=True)
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"cpu": cpu_label(), "args": vars(a), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
