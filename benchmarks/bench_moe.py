"""Mixture-of-experts against dense: offline shared-prefix throughput at equal ACTIVE parameters.

Two random-weight models (transformers' init, saved once to a temporary directory with SmolLM2's
tokenizer): a Mixtral (``--experts`` experts, top ``--top-k``, expert width ``--expert-intermediate``)
and a Llama whose MLP is ``top_k * expert_intermediate`` wide, so that both run the same
multiply-adds per token (the Mixtral's router, ``hidden * experts`` per layer, aside).  Attention,
norms, embeddings and the vocabulary are the same (Mixtral's attention is Llama's), so the
difference is the MoE block: routing, sorting the (token, expert) slots, one GEMM pair per expert
on fewer rows, the scatter back; and the Llama may run the native layer loops, which an MoE model
never does (``DecoderLM.native_layers``).

For each ``--dtypes`` value, each model gets bench_offline's workload (``benchmarks/workloads.py``:
groups of prompts sharing a system prompt, random ids, greedy, EOS ignored) in ONE
``Engine.generate`` call after a warm-up and a cache flush; ``--quantization none`` and
``--dense-kernel plain`` (F.linear for both models: the experts never use oneDNN's packed weights)
unless asked otherwise.  Prints wall time, total tok/s, hit rate and MoE/dense per dtype.

    .venv/bin/python -m benchmarks.bench_moe                           # defaults: 16 x 8 requests, fp32 and bf16
    .venv/bin/python -m benchmarks.bench_moe --groups 2 --prompts-per-group 2 --system-len 64 \\
        --question-len 16 --output-len 8                               # smoke test
"""
from __future__ import annotations

import argparse
import gc
import json
import tempfile
from typing import Any

import torch

from benchmarks.peer_runners.common import batch_workload
from benchmarks.radix_peer import RadixPeer
from benchmarks.workloads import add_shared_prefix_args, random_prompts, shared_prefix_prompts, workload_line


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shared_prefix_args(p)
    g = p.add_argument_group("models")
    g.add_argument("--hidden", type=int, default=512)
    g.add_argument("--layers", type=int, default=4)
    g.add_argument("--heads", type=int, default=8)
    g.add_argument("--kv-heads", type=int, default=4)
    g.add_argument("--experts", type=int, default=8)
    g.add_argument("--top-k", type=int, default=2)
    g.add_argument("--expert-intermediate", type=int, default=1024, help="each expert's MLP width")
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    p.add_argument("--quantization", default="none", choices=["none", "int8", "w8a8", "int4"])
    p.add_argument("--dense-kernel", default="plain", choices=["plain", "packed", "auto"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json-out", default=None, metavar="PATH")
    return p.parse_args()


def build_models(args: argparse.Namespace, root: str) -> dict[str, tuple[str, dict[str, int]]]:
    """Save the Mixtral and the dense Llama under ``root``; name -> (path, parameter counts)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, MixtralConfig

    from radixserve.model.loader import resolve_hf_dir

    tok = AutoTokenizer.from_pretrained(resolve_hf_dir(None))
    common = dict(vocab_size=len(tok), hidden_size=args.hidden, num_hidden_layers=args.layers,
                  num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, max_position_embeddings=4096,
                  tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    configs = {"moe": MixtralConfig(**common, num_local_experts=args.experts, num_experts_per_tok=args.top_k,
                                    intermediate_size=args.expert_intermediate),
               "dense": LlamaConfig(**common, intermediate_size=args.top_k * args.expert_intermediate)}
    out = {}
    for name, cfg in configs.items():
        torch.manual_seed(args.seed)
        model = AutoModelForCausalLM.from_config(cfg)
        total = sum(p.numel() for p in model.parameters())
        experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
        active = total - experts + experts * args.top_k // args.experts
        path = f"{root}/{name}"
        model.save_pretrained(path)
        tok.save_pretrained(path)
        out[name] = (path, {"params": total, "active_params": active})
        del model
    return out


def run(args: argparse.Namespace, path: str, dtype: str) -> dict[str, Any]:
    from benchmarks.bench_offline import default_pool
    from radixserve import Engine

    n = args.groups * args.prompts_per_group
    pool = default_pool(argparse.Namespace(**vars(args), disable_radix_cache=False), n)
    engine = Engine(path, dtype=dtype, quantization=args.quantization, dense_kernel=args.dense_kernel,
                    max_total_tokens=pool)
    vocab = engine.runner.model.config.vocab_size
    prompts = shared_prefix_prompts(args.groups, args.prompts_per_group, args.system_len, args.question_len,
                                    vocab, args.seed)
    peer = RadixPeer(engine)
    peer.run_batch(random_prompts(4, 48, vocab, args.seed + 12345), [8] * 4)  # warm-up, unrelated ids
    res = batch_workload(peer, prompts, [args.output_len] * n)  # flushes the cache first
    for k in ("outputs", "cached_per_request", "requests"):
        res.pop(k)
    res["numerics"] = engine.runner.numerics.describe()
    engine.shutdown()
    del engine
    gc.collect()
    return res


def main() -> None:
    args = parse_args()
    print(f"{workload_line(args)}; threads={torch.get_num_threads()}")
    result: dict[str, Any] = {"args": vars(args), "runs": {}}
    with tempfile.TemporaryDirectory(prefix="bench_moe_") as root:
        models = build_models(args, root)
        for name, (_, counts) in models.items():
            print(f"{name:5s}: {counts['params'] / 1e6:.1f} M parameters, {counts['active_params'] / 1e6:.1f} M "
                  "active per token")
        result["models"] = {name: counts for name, (_, counts) in models.items()}
        for dtype in args.dtypes:
            for name, (path, _) in models.items():
                res = run(args, path, dtype)
                result["runs"][f"{name}/{dtype}"] = res
                print(f"{name:5s} {dtype:8s}: {res['time_s']:7.2f} s  total {res['total_tok_s']:9.1f} tok/s  "
                      f"output {res['output_tok_s']:8.1f} tok/s  hit rate {res['hit_rate']:.1%}  ({res['numerics']})",
                      flush=True)
            ratio = result["runs"][f"moe/{dtype}"]["total_tok_s"] / result["runs"][f"dense/{dtype}"]["total_tok_s"]
            result[f"moe_over_dense/{dtype}"] = ratio
            print(f"MoE / dense total tok/s at {dtype}: {ratio:.2f}x", flush=True)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(result, f, indent=2)
        print(f"wrote {args.json_out}")


if __name__ == "__main__":
    main()
