"""Decode and shared-prefix throughput of every dense family at one shape, against Llama.

Each family gets a random checkpoint of the same shape (SmolLM2-135M's by default: hidden 576,
30 layers, 9 query / 3 KV heads of 64, MLP 1536, vocabulary 49152), with the family's own
features switched on as its published models have them (Qwen 3's q/k norms, Gemma 3's 5:1
sliding/full layers with a 512-token window, Gemma 2's soft-capping, Phi-4-mini's partial
rotary).  For each: batch-1 decode tokens/s with the weight bandwidth it implies (weight bytes
read per step / step time, gpt-fast's honest number for memory-bound decode), and the offline
shared-prefix workload of ``bench_offline`` (``--groups`` x ``--prompts-per-group``) in
tokens/s.  Ratios to Llama are of one run on one machine.

    .venv/bin/python -m benchmarks.bench_families                    # fp32, all families
    .venv/bin/python -m benchmarks.bench_families --dtype bfloat16 --families llama qwen3
"""
from __future__ import annotations

import argparse
import gc
import platform
import subprocess
import tempfile
import time
from typing import Any

import torch

from benchmarks.workloads import add_shared_prefix_args, shared_prefix_prompts

SHAPE = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
             num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=4096,
             tie_word_embeddings=True)


def family_config(name: str) -> Any:
    """A transformers config of family ``name`` at ``SHAPE`` with the family's own features."""
    import transformers as tf

    n = SHAPE["num_hidden_layers"]
    if name == "llama":
        return tf.LlamaConfig(**SHAPE)
    if name == "qwen3":
        return tf.Qwen3Config(**SHAPE)
    if name == "phi3":
        return tf.Phi3Config(**SHAPE, partial_rotary_factor=0.75, pad_token_id=0)
    if name == "gemma2":
        return tf.Gemma2Config(**SHAPE, query_pre_attn_scalar=64, sliding_window=512,
                               layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)])
    if name == "gemma3":
        return tf.Gemma3TextConfig(**SHAPE, query_pre_attn_scalar=64, sliding_window=512,
                                   layer_types=["full_attention" if i % 6 == 5 else "sliding_attention"
                                                for i in range(n)])
    raise ValueError(f"unknown family {name!r}")


def save_random(name: str, path: str, tokenizer_dir: str) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(family_config(name)).save_pretrained(path)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(path)


def measure(path: str, args: argparse.Namespace) -> dict[str, float]:
    from radixserve import Engine

    eng = Engine(path, dtype=args.dtype, max_total_tokens=args.max_total_tokens, quantization="none")
    warm = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
    eng.generate(input_ids=[list(range(100, 140))], sampling_params=warm)
    gen = {"max_new_tokens": args.decode_tokens, "temperature": 0, "ignore_eos": True}
    t = time.perf_counter()
    eng.generate(input_ids=[list(range(200, 232))], sampling_params=gen)
    decode_s = (time.perf_counter() - t) / args.decode_tokens
    eng.flush_cache()
    prompts = shared_prefix_prompts(args.groups, args.prompts_per_group, args.system_len, args.question_len,
                                    SHAPE["vocab_size"], 0)
    out_gen = {"max_new_tokens": args.output_len, "temperature": 0, "ignore_eos": True}
    t = time.perf_counter()
    eng.generate(input_ids=prompts, sampling_params=out_gen)
    offline_s = time.perf_counter() - t
    eng.shutdown()
    tokens = sum(len(p) for p in prompts) + len(prompts) * args.output_len
    return {"decode_tok_s": 1.0 / decode_s, "offline_tok_s": tokens / offline_s}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--families", nargs="+", default=["llama", "qwen3", "phi3", "gemma2", "gemma3"])
    p.add_argument("--dtype", default="float32")
    p.add_argument("--decode-tokens", type=int, default=64)
    p.add_argument("--max-total-tokens", type=int, default=16384)
    add_shared_prefix_args(p)
    p.set_defaults(groups=4, prompts_per_group=4, system_len=256, question_len=32, output_len=32)
    args = p.parse_args()
    from radixserve.model.loader import default_model_path, resolve_hf_dir

    tokenizer_dir = resolve_hf_dir(default_model_path())
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model_name = next((ln.split(":", 1)[1].strip() for ln in cpu.splitlines() if ln.startswith("Model name")), "?")
    print(f"# {model_name}, {platform.machine()}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"dtype {args.dtype}")
    fp_bytes = 4 if args.dtype == "float32" else 2
    results: dict[str, dict[str, float]] = {}
    for name in args.families:
        with tempfile.TemporaryDirectory() as d:
            save_random(name, d, tokenizer_dir)
            results[name] = measure(d, args)
        params = _param_count(family_config(name))
        results[name]["GB_s"] = params * fp_bytes * results[name]["decode_tok_s"] / 1e9
        gc.collect()
    base = results.get("llama")
    print(f"{'family':10} {'decode tok/s':>13} {'GB/s':>7} {'x llama':>8} {'offline tok/s':>14} {'x llama':>8}")
    for name, r in results.items():
        rd = r["decode_tok_s"] / base["decode_tok_s"] if base else float("nan")
        ro = r["offline_tok_s"] / base["offline_tok_s"] if base else float("nan")
        print(f"{name:10} {r['decode_tok_s']:13.1f} {r['GB_s']:7.2f} {rd:8.3f} {r['offline_tok_s']:14.1f} {ro:8.3f}")


def _param_count(cfg: Any) -> int:
    """Weights a decode step reads: the decoder's linear layers and the (tied) LM head."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(cfg)
    return sum(p.numel() for p in m.parameters())


if __name__ == "__main__":
    main()
