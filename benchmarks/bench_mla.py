"""Multi-head latent attention against dense attention: KV bytes per token, and the offline
shared-prefix workload of ``bench_offline`` on a small MLA model against a Llama with (nearly)
the same active parameters.

KV bytes per token come from the pool shapes the models ask for (``kv_cache_shape`` of the
model built on the meta device, then ``KVPool.bytes_per_slot``): the tiny test family, a
DeepSeek-V2-Lite- and a DeepSeek-V2-shaped config, each against the uncompressed cache of the
same attention (per head a K of ``qk_nope + qk_rope`` and a V of ``v_head_dim``, what
transformers' cache holds).  Throughput: random checkpoints at SmolLM2-135M's width (hidden 576,
30 layers, 9 heads, MLP 1536): Llama with 3 KV heads of 64, and MLA with no q_lora, nope 32 +
rope 32, v 64, kv_lora_rank 128 (866k attention weights per layer against Llama's 885k); first
with a pool that holds everything, then with both pools given the same bytes (``--kv-mib``).

    .venv/bin/python -m benchmarks.bench_mla                     # fp32
    .venv/bin/python -m benchmarks.bench_mla --dtype bfloat16 --kv-mib 64
"""
from __future__ import annotations

import argparse
import platform
import subprocess
import tempfile
import time
from typing import Any

import torch

from benchmarks.workloads import add_shared_prefix_args, shared_prefix_prompts

WIDTH = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
             max_position_embeddings=4096, tie_word_embeddings=True)
MLA_SHAPE = dict(WIDTH, num_key_value_heads=9, q_lora_rank=None, kv_lora_rank=128, qk_nope_head_dim=32,
                 qk_rope_head_dim=32, v_head_dim=64, first_k_dense_replace=30)
LITE = dict(vocab_size=102400, hidden_size=2048, intermediate_size=10944, moe_intermediate_size=1408,
            num_hidden_layers=27, num_attention_heads=16, num_key_value_heads=16, q_lora_rank=None, kv_lora_rank=512,
            qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=64, n_shared_experts=2,
            num_experts_per_tok=6, first_k_dense_replace=1)
TINY = dict(vocab_size=49152, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
            v_head_dim=16, first_k_dense_replace=3)  # tests/helpers/families.py's deepseek_v2
V2 = dict(LITE, hidden_size=5120, intermediate_size=12288, num_hidden_layers=60, num_attention_heads=128,
          num_key_value_heads=128, q_lora_rank=1536, n_routed_experts=160, num_experts_per_tok=6)


def kv_bytes(cfg: Any, dtype: torch.dtype) -> tuple[int, int]:
    """(bytes per token of our pool, of the uncompressed K/V of the same attention)."""
    from radixserve.mem_cache.kv_pool import KVPool
    from radixserve.model.registry import model_class

    with torch.device("meta"):
        model = model_class(cfg)(cfg, 16)
    heads, dim, shared = model.kv_cache_shape()
    ours = KVPool.bytes_per_slot(cfg.num_hidden_layers, heads, dim, dtype, shared)
    size = torch.tensor([], dtype=dtype).element_size()
    dense = cfg.num_hidden_layers * cfg.num_attention_heads * (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
                                                               + cfg.v_head_dim) * size
    return ours, dense


def measure(path: str, args: argparse.Namespace, max_total_tokens: int) -> dict[str, float]:
    from radixserve import Engine

    eng = Engine(path, dtype=args.dtype, max_total_tokens=max_total_tokens, quantization="none")
    eng.generate(input_ids=[list(range(100, 140))], sampling_params={"max_new_tokens": 8, "ignore_eos": True})
    eng.flush_cache()
    prompts = shared_prefix_prompts(args.groups, args.prompts_per_group, args.system_len, args.question_len,
                                    WIDTH["vocab_size"], 0)
    t = time.perf_counter()
    eng.generate(input_ids=prompts, sampling_params={"max_new_tokens": args.output_len, "temperature": 0,
                                                     "ignore_eos": True})
    wall = time.perf_counter() - t
    stats = eng.stats()
    eng.shutdown()
    tokens = sum(len(p) for p in prompts) + len(prompts) * args.output_len
    return {"wall_s": wall, "tok_s": tokens / wall, "retractions": stats.get("retractions", 0)}


def main() -> None:
    import transformers as tf
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from radixserve.model.loader import default_model_path, resolve_hf_dir

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", default="float32")
    p.add_argument("--kv-mib", type=float, default=96.0, help="the equal KV budget of the second run")
    add_shared_prefix_args(p)
    p.set_defaults(groups=4, prompts_per_group=8, system_len=512, question_len=32, output_len=32)
    args = p.parse_args()
    dtype = getattr(torch, args.dtype)
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    cpu_name = next((ln.split(":", 1)[1].strip() for ln in cpu.splitlines() if ln.startswith("Model name")), "?")
    print(f"# {cpu_name}, {platform.machine()}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"dtype {args.dtype}")
    shapes = {"tiny family": tf.DeepseekV2Config(**TINY), "V2-Lite shape": tf.DeepseekV2Config(**LITE), "V2 shape": tf.DeepseekV2Config(**V2),
              "bench MLA": tf.DeepseekV2Config(**MLA_SHAPE)}
    print(f"{'KV bytes/token':16} {'MLA pool':>10} {'uncompressed':>13} {'ratio':>6}")
    for name, cfg in shapes.items():
        ours, dense = kv_bytes(cfg, dtype)
        print(f"{name:16} {ours:10,} {dense:13,} {dense / ours:6.1f}")
    configs = {"llama": tf.LlamaConfig(**WIDTH, num_key_value_heads=3, head_dim=64),
               "mla": tf.DeepseekV2Config(**MLA_SHAPE)}
    tok_dir = resolve_hf_dir(default_model_path())
    print(f"{'model':6} {'attn params/layer':>18} {'KV B/token':>11} {'pool':>8} {'wall s':>8} {'tok/s':>8} {'retract':>8}")
    for name, cfg in configs.items():
        with torch.device("meta"):
            hf = AutoModelForCausalLM.from_config(cfg)
        attn = sum(p.numel() for p in hf.model.layers[0].self_attn.parameters())
        per_token = kv_bytes(cfg, dtype)[0] if name == "mla" else (
            2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * dtype.itemsize)
        with tempfile.TemporaryDirectory() as d:
            torch.manual_seed(0)
            AutoModelForCausalLM.from_config(cfg).save_pretrained(d)
            AutoTokenizer.from_pretrained(tok_dir).save_pretrained(d)
            for label, slots in (("all", 1 << 15), (f"{args.kv_mib:g}MiB", int(args.kv_mib * 2 ** 20) // per_token)):
                r = measure(d, args, slots)
                print(f"{name:6} {attn:18,} {per_token:11,} {label:>8} {r['wall_s']:8.2f} {r['tok_s']:8.1f} "
                      f"{r['retractions']:8}")


if __name__ == "__main__":
    main()
