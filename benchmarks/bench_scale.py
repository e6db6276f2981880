"""radixserve against HF, llama.cpp and vLLM at the sizes and contexts users serve, in one run.

Shapes (scale_models.py: random weights in the shapes of real models, one GGUF file each,
Q4_1 by default, that every peer loads): ``0.3b`` (24 layers, hidden 1024, GQA 16:4, SmolLM2's
vocabulary), ``1.5b`` (Qwen2.5-1.5B), ``8b`` (Llama-3-8B).  Per shape, the same token ids go
through every peer (peer_runners/common.py's protocol, start-up untimed):

  single     one request at a time: 32-token prompt, 64 greedy tokens (decode tok/s);
  docs_N     shared documents of N tokens (``--contexts``), each with short questions
             (64 own tokens, ``DOCS`` says how many documents, questions and output tokens);
  sharegpt   64 ShareGPT first turns (outputs capped at 256), all at once.

Peers: radixserve ``--dtype`` (in process), HF fp32 (in process; only ``--hf-workloads``,
timed on ``--hf-max-batches`` batches and extrapolated: it has no prefix cache and is 10x off
the others), llama.cpp (``--llama-modes``, the same GGUF) and vLLM CPU (``--vllm-dtypes``,
prefix caching on), each skipped with its install commands when missing.  For radixserve
also: the attention share of its layer time per context (attention_share.py), the achieved
GFLOP/s of each docs run against the bf16/fp32 GEMM peak, and single-stream bytes/s against
the machine's copy rate (roofline.py).  Output: ``--json-out``; scale_report.py turns one or
more such files into the markdown table and the PNG plots.

    .venv/bin/python -m benchmarks.bench_scale --shapes 0.3b,1.5b --json-out scale.json   # full (hours)
    .venv/bin/python -m benchmarks.bench_scale --quick --json-out before.json             # regression guard
    .venv/bin/python -m benchmarks.bench_scale --quick --compare before.json              # ... after a change
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import random
from typing import Any

from benchmarks.bench_peers import pool_tokens, run_hf, run_radixserve, same_ids, subprocess_peers
from benchmarks.peer_procs import LLAMA, find_python, run_peer
from benchmarks.peers_report import machine
from benchmarks.report import write_json
from benchmarks.roofline import batch_roofline, decode_bandwidth, gemm_rates, memory_rates
from benchmarks.scale_models import SHAPES, checkpoint, param_count
from benchmarks.workloads import random_prompts, sample_sharegpt, shared_prefix_prompts

# context -> (documents, questions per document, output tokens)
DOCS = {512: (16, 8, 64), 2048: (8, 8, 64), 4096: (4, 8, 64), 8192: (2, 8, 32), 16384: (2, 4, 32)}
GEMM_M = 1024  # rows of the peak-GEMM matmuls
QUICK = dict(shapes="0.3b", contexts="512,4096", skip="hf,llama,vllm", sharegpt_n=16, single_repeats=1)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--shapes", default="0.3b,1.5b", help="comma list of " + ",".join(SHAPES))
    p.add_argument("--contexts", default="512,4096,16384", help="document lengths: " + ",".join(map(str, DOCS))
                   + " or one given with --docs")
    p.add_argument("--docs", action="append", default=[], metavar="CTX=DxQxO",
                   help="documents, questions per document and output tokens at context CTX (e.g. 16384=1x4x32), "
                        "instead of DOCS'")
    p.add_argument("--workloads", default="single,docs,sharegpt")
    p.add_argument("--quant", default="Q4_1", help="the GGUF files' matrix type (gguf.quants)")
    p.add_argument("--dtype", default="auto", help="radixserve's dtype")
    p.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--radix-single", action="append", default=[], metavar="K=V[,K=V]",
                   help="extra radixserve configurations run on the single stream only, as the weight precision "
                        "class of llama.cpp's file (default: quantization=int4; 'none' for none)")
    p.add_argument("--skip", default="", help="comma list of peers to skip: hf,llama,vllm")
    p.add_argument("--hf-workloads", default="single,docs_512", help="what HF fp32 runs")
    p.add_argument("--hf-batch-size", type=int, default=16)
    p.add_argument("--hf-max-batches", type=int, default=1)
    p.add_argument("--llama-workloads", default="all", help="what llama.cpp runs (comma list, or all)")
    p.add_argument("--llama-modes", default="batched")
    p.add_argument("--llama-arg", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--vllm-dtypes", default="bfloat16")
    p.add_argument("--vllm-arg", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--sharegpt-n", type=int, default=64)
    p.add_argument("--sharegpt-max-output", type=int, default=256)
    p.add_argument("--single-repeats", type=int, default=3)
    p.add_argument("--no-attention-share", action="store_true")
    p.add_argument("--quick", action="store_true", help="the regression guard: " + ", ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in QUICK.items()) + " (flags given still win)")
    p.add_argument("--compare", default=None, metavar="JSON", help="print radixserve's figures against this run's")
    p.add_argument("--log-dir", default="/tmp")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json-out", default=None, metavar="PATH")
    args = p.parse_args()
    if args.quick:
        for k, v in QUICK.items():
            if getattr(args, k) == p.get_default(k):
                setattr(args, k, v)
    args.radix_single = [] if "none" in args.radix_single else args.radix_single or ["quantization=int4"]
    args.docs_plan = dict(DOCS)
    for spec in args.docs:
        ctx, _, dqo = spec.partition("=")
        try:
            args.docs_plan[int(ctx)] = tuple(int(x) for x in dqo.split("x"))
        except ValueError:
            p.error(f"--docs {spec!r}: expected CTX=DxQxO, e.g. 16384=1x4x32")
        if len(args.docs_plan[int(ctx)]) != 3:
            p.error(f"--docs {spec!r}: expected CTX=DxQxO, e.g. 16384=1x4x32")
    args.skip = {s for s in args.skip.split(",") if s}
    args.shapes = [s for s in args.shapes.split(",") if s]
    args.contexts = [int(c) for c in args.contexts.split(",") if c]
    args.workloads = {w for w in args.workloads.split(",") if w}
    args.hf_workloads = {w for w in args.hf_workloads.split(",") if w}
    bad = [s for s in args.shapes if s not in SHAPES] + [str(c) for c in args.contexts if c not in args.docs_plan]
    if bad or args.workloads - {"single", "docs", "sharegpt"}:
        p.error(f"unknown shape/context/workload {bad or sorted(args.workloads)}")
    return args


def build_job(args: argparse.Namespace, vocab: int, tokenizer: Any) -> dict[str, Any]:
    """Every workload of one shape as token ids (the same for every peer)."""
    job: dict[str, Any] = {"warmup": random_prompts(4, 48, vocab, args.seed + 12345), "batch_order": []}
    if "single" in args.workloads:
        job["single"] = {"prompts": random_prompts(1 + 2 * args.single_repeats, 32, vocab, args.seed + 1),
                         "output_len": 64}
    if "docs" in args.workloads:
        for ctx in args.contexts:
            docs, questions, out = args.docs_plan[ctx]
            prompts = shared_prefix_prompts(docs, questions, ctx, 64, vocab, args.seed + ctx)
            job[f"docs_{ctx}"] = {"prompts": prompts, "output_lens": [out] * len(prompts)}
            job["batch_order"].append(f"docs_{ctx}")
    if "sharegpt" in args.workloads:
        items = sample_sharegpt(args.sharegpt_n, tokenizer, None, random.Random(args.seed))
        job["sharegpt"] = {"prompts": [tokenizer.encode(it.prompt) for it in items],
                           "output_lens": [min(it.output_len, args.sharegpt_max_output) for it in items]}
        job["batch_order"].append("sharegpt")
    return job


def subset(job: dict[str, Any], names: set[str]) -> dict[str, Any]:
    out = {k: v for k, v in job.items() if k in names or k == "warmup"}
    out["batch_order"] = [w for w in job["batch_order"] if w in names]
    return out


def run_shape(args: argparse.Namespace, name: str) -> dict[str, Any]:
    from radixserve.model.loader import load_config, resolve_hf_dir
    from radixserve.tokenizer import load_hf_tokenizer

    gguf = checkpoint(name, args.quant)
    hf_dir = resolve_hf_dir(gguf)
    cfg = load_config(hf_dir)
    job = build_job(args, cfg.vocab_size, load_hf_tokenizer(hf_dir))
    peer_args = argparse.Namespace(**{**vars(args), "model": gguf, "llama_python": None, "vllm_python": None})
    if not args.no_attention_share and not any(a.startswith("max_total_tokens=") for a in args.engine_arg):
        pool = max(pool_tokens(job, True), max(args.contexts) + 4 * (64 + 16) + 1024)  # room for the probe
        peer_args.engine_arg = [*args.engine_arg, f"max_total_tokens={pool}"]
    out: dict[str, Any] = {"shape": name, "like": SHAPES[name].like, "params": param_count(cfg), "gguf": gguf,
                           "gemm": gemm_rates(cfg, m=GEMM_M), "memory": memory_rates(), "results": {}, "skipped": {}}
    print(f"\n=== {name} ({SHAPES[name].like}, {out['params'] / 1e9:.2f}B params); GEMM peak bf16 "
          f"{out['gemm']['bfloat16']['peak']:.0f}, fp32 {out['gemm']['float32']['peak']:.0f} GFLOP/s", flush=True)
    print("== radixserve (in process)", flush=True)
    ours = run_radixserve(peer_args, job, probe=None if args.no_attention_share else
                          (lambda eng: [attention_probe(eng, c, cfg.vocab_size) for c in args.contexts]))
    out["results"]["radixserve"] = ours
    for variant in args.radix_single if "single" in job else []:
        extra = [kv for kv in variant.split(",") if kv]
        label = "radixserve " + " ".join(kv.split("=")[1] for kv in extra)
        print(f"== {label} (in process, single stream only)", flush=True)
        var_args = argparse.Namespace(**{**vars(peer_args), "engine_arg": peer_args.engine_arg + extra})
        out["results"][label] = run_radixserve(var_args, subset(job, {"single"}))
    if "hf" not in args.skip:
        print("== HF fp32 (in process)", flush=True)
        out["results"]["HF fp32"] = run_hf(peer_args, hf_dir, subset(job, args.hf_workloads))
    for label, spec, opts in subprocess_peers(peer_args, gguf):
        python, why = find_python(spec, None)
        if python is None:
            print(f"== {label}: SKIPPED. {why}", flush=True)
            out["skipped"][label] = why
            continue
        print(f"== {label} (subprocess)", flush=True)
        log = os.path.join(args.log_dir, f"bench_scale_{name}_{label.replace(' ', '_').replace('.', '')}.log")
        mine = job if spec is not LLAMA or args.llama_workloads == "all" else \
            subset(job, set(args.llama_workloads.split(",")))
        try:
            out["results"][label] = run_peer(spec, python, {**mine, "options": opts, "model_gguf": gguf,
                                                            "hf_dir": hf_dir}, log)
        except RuntimeError as e:
            print(f"  FAILED: {e}", flush=True)
            out["skipped"][label] = str(e)
        gc.collect()
    out["agreement"] = {n: {w: same_ids(ours[w], r[w]) for w in job["batch_order"] if w in r}
                        for n, r in out["results"].items() if n != "radixserve"}
    out["roofline"] = {w: batch_roofline(cfg, job[w], ours, out["gemm"], GEMM_M, name=w)
                       for w in job["batch_order"] if w.startswith("docs_") and w in ours}
    out["bandwidth"] = decode_bandwidth(cfg, out["results"], gguf)
    out["requests"] = {w: {"requests": len(job[w]["prompts"]), "prompt_tokens": sum(map(len, job[w]["prompts"])),
                           "output_tokens": sum(job[w]["output_lens"])} for w in job["batch_order"]}
    for r in out["results"].values():
        for w in r.values():
            if isinstance(w, dict):
                for k in ("outputs", "output_ids", "cached_per_request"):
                    w.pop(k, None)
    return out


def attention_probe(engine: Any, context: int, vocab: int) -> dict[str, Any]:
    from benchmarks.attention_share import attention_share

    res = attention_share(engine, context, vocab)
    print(f"  attention share at {context}: prefill {res['prefill']['share']:.1%}, "
          f"decode {res['decode']['share']:.1%}", flush=True)
    return res


def main() -> None:
    args = parse_args()
    mach = machine()
    print(f"machine: {mach['cpu']}, {mach['cpus']} CPUs, flags {' '.join(mach['flags'])}; "
          f"load average {mach['loadavg'][0]:.2f}", flush=True)
    report: dict[str, Any] = {"machine": mach, "memory": memory_rates(), "shapes": {},
                              "args": {k: sorted(v) if isinstance(v, set) else v for k, v in vars(args).items()}}
    print(f"memory: copy {report['memory']['copy_gb_s']:.1f} GB/s, read {report['memory']['read_gb_s']:.1f} GB/s")
    for name in args.shapes:
        report["shapes"][name] = run_shape(args, name)
        for k in ("copy_gb_s", "read_gb_s"):  # the machine's rate: the best of every measurement
            report["memory"][k] = max(report["memory"][k], report["shapes"][name]["memory"][k])
        write_json(args.json_out, report)  # what finished survives a later failure
    from benchmarks.scale_report import print_report

    print_report([report])
    if args.compare:
        with open(args.compare) as f:
            print_report([json.load(f), report], compare_runs=True)


if __name__ == "__main__":
    main()
