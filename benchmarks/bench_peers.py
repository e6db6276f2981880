"""radixserve against its peers on the same workloads, in one run: HF transformers (fp32),
llama.cpp (llama-cpp-python, the same GGUF file) and vLLM's CPU build, when installed.

Workloads (token ids, greedy, EOS ignored; every peer gets exactly the same ids):
  single    one request at a time: 32-token prompt, 64 tokens (decode tok/s, see
            peer_runners/common.py), after a warm-up;
  shared    generated shared prefix as bench_offline.py: 16 groups x 8 prompts, 512-token
            system prompt + 64-token question, 64 output tokens (total tok/s, hit rate);
  sharegpt  64 ShareGPT first human turns (SGLang's filter, as bench_serving.py), output =
            the reply's token count capped at --sharegpt-max-output, all submitted at once.
Then the roofline of radixserve's shared-prefix run (roofline.py) and the bytes/s of
single-stream decode.  radixserve runs in this process (``radixserve.Engine``), HF too;
llama.cpp and vLLM run as subprocesses under their own Python (peer_procs.py).

    .venv/bin/python -m benchmarks.bench_peers --json-out benchmarks/results/peers.json
    .venv/bin/python -m benchmarks.bench_peers --groups 2 --prompts-per-group 2 --sharegpt-n 4 \\
        --sharegpt-max-output 16 --single-repeats 1 --hf-max-batches 1 --vllm-dtypes float32   # smoke
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import random
from typing import Any, Optional

from benchmarks.peer_procs import LLAMA, VLLM, PeerSpec, find_python, run_peer
from benchmarks.peer_runners.common import batches, run_job
from benchmarks.peers_report import (machine, print_bandwidth, print_gemm, print_ratios, print_roofline,
                          print_table)
from benchmarks.report import write_json
from benchmarks.roofline import batch_roofline, decode_bandwidth, decode_weight_bytes, gemm_rates
from benchmarks.workloads import add_shared_prefix_args, random_prompts, sample_sharegpt, shared_prefix_prompts

WORKLOADS = ("single", "shared", "sharegpt")


def parse_kv(pairs: list[str]) -> dict[str, Any]:
    """``key=value`` pairs as a dict; a value is parsed as JSON when it is JSON (4096, true, null,
    0.5, {...}), else kept as a string; dashes in keys become underscores."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"expected key=value, got {pair!r}")
        try:
            out[key.replace("-", "_")] = json.loads(value)
        except json.JSONDecodeError:
            out[key.replace("-", "_")] = value
    return out


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--model", default=None, help=".gguf or HF dir (default: SmolLM2-135M-Instruct Q4_1 GGUF)")
    p.add_argument("--dtype", default="auto", help="radixserve's dtype")
    p.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="extra radixserve.Engine keyword (repeatable), e.g. chunked_prefill_size=1024")
    p.add_argument("--skip", default="", help="comma list of peers to skip: hf,llama,vllm")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="comma list of " + ",".join(WORKLOADS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--single-prompt-len", type=int, default=32)
    p.add_argument("--single-output-len", type=int, default=64)
    p.add_argument("--single-repeats", type=int, default=3, help="timed runs of each length (median)")
    add_shared_prefix_args(p)
    p.add_argument("--sharegpt-n", type=int, default=64)
    p.add_argument("--sharegpt-max-output", type=int, default=256, help="cap on a reply's token count")
    p.add_argument("--hf-batch-size", type=int, default=16)
    p.add_argument("--hf-max-batches", type=int, default=None,
                   help="time only the first N HF batches per workload and EXTRAPOLATE linearly")
    p.add_argument("--llama-python", default=None, help=f"default ${LLAMA.env_var} or {LLAMA.default_python}")
    p.add_argument("--llama-modes", default="sequential,batched",
                   help="one llama.cpp run per mode (peer_runners/llama_runner.py)")
    p.add_argument("--llama-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="llama.cpp option (n_threads, n_batch, n_ubatch, flash_attn)")
    p.add_argument("--vllm-python", default=None, help=f"default ${VLLM.env_var} or {VLLM.default_python}")
    p.add_argument("--vllm-dtypes", default="float32,bfloat16", help="one vLLM run per dtype")
    p.add_argument("--vllm-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="extra vllm.LLM keyword; omp=iomp|gomp picks the preloaded OpenMP runtime (default iomp)")
    p.add_argument("--gemm-m", type=int, default=1024, help="rows of the peak-GEMM matmuls")
    p.add_argument("--log-dir", default="/tmp", help="where the peer subprocesses' full logs go")
    p.add_argument("--json-out", default=None, metavar="PATH")
    args = p.parse_args()
    args.skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    args.workloads = {s.strip() for s in args.workloads.split(",") if s.strip()}
    if args.skip - {"hf", "llama", "vllm"} or args.workloads - set(WORKLOADS):
        p.error(f"--skip takes hf,llama,vllm; --workloads takes {','.join(WORKLOADS)}")
    if args.hf_max_batches is not None and args.hf_max_batches < 1:
        p.error("--hf-max-batches must be >= 1")
    return args


def build_job(args: argparse.Namespace, tokenizer: Any, vocab: int) -> dict[str, Any]:
    """The workloads as token ids, shared by every peer (peer_runners/common.py)."""
    job: dict[str, Any] = {"warmup": random_prompts(4, 48, vocab, args.seed + 12345)}
    if "single" in args.workloads:
        job["single"] = {"prompts": random_prompts(1 + 2 * args.single_repeats, args.single_prompt_len, vocab,
                                                   args.seed + 1), "output_len": args.single_output_len}
    if "shared" in args.workloads:
        prompts = shared_prefix_prompts(args.groups, args.prompts_per_group, args.system_len, args.question_len,
                                        vocab, args.seed)
        job["shared_prefix"] = {"prompts": prompts, "output_lens": [args.output_len] * len(prompts)}
    if "sharegpt" in args.workloads:
        items = sample_sharegpt(args.sharegpt_n, tokenizer, None, random.Random(args.seed))
        job["sharegpt"] = {"prompts": [tokenizer.encode(it.prompt) for it in items],
                           "output_lens": [min(it.output_len, args.sharegpt_max_output) for it in items]}
    return job


def pool_tokens(job: dict[str, Any], shared: bool) -> int:
    """KV slots for the biggest batch workload (a prefix shared by sorted neighbours counted once
    when ``shared``) + 10% + 1024: nothing is evicted."""
    need = 0
    for prompts, output_lens in batches(job):
        prompts = sorted(prompts)
        total = sum(map(len, prompts)) + sum(output_lens)
        if shared:
            total -= sum(next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), min(len(x), len(y)))
                         for x, y in zip(prompts, prompts[1:]))
        need = max(need, total)
    return int(need * 1.1) + 1024


def run_radixserve(args: argparse.Namespace, job: dict[str, Any], probe: Any = None) -> dict[str, Any]:
    """The job through an in-process ``Engine``; then ``probe(engine)``, if given, into ``res["probe"]``."""
    from radixserve import Engine
    from benchmarks.radix_peer import RadixPeer

    extra = parse_kv(args.engine_arg)
    kwargs = {"dtype": args.dtype, **extra}
    kwargs.setdefault("max_total_tokens", pool_tokens(job, not kwargs.get("disable_radix_cache")))
    engine = Engine(args.model, **kwargs)
    res = run_job(RadixPeer(engine), job, log=lambda s: print("  " + s.strip(), flush=True))
    res["info"] = {"peer": "radixserve", "dtype": engine.info.dtype, "engine_kwargs": kwargs,
                   "quantization": getattr(engine.info, "quantization", "none")}
    model = getattr(getattr(engine, "runner", None), "model", None)
    if model is not None:
        res["info"]["decode_weight_bytes"] = decode_weight_bytes(model)
    if probe is not None:
        res["probe"] = probe(engine)
    engine.shutdown()
    del engine
    gc.collect()
    return res


def run_hf(args: argparse.Namespace, hf_dir: str, job: dict[str, Any]) -> dict[str, Any]:
    from benchmarks.hf_baseline import HFPeer

    peer = HFPeer(hf_dir, args.hf_batch_size, args.hf_max_batches)
    res = run_job(peer, job, log=lambda s: print("  " + s.strip(), flush=True))
    res["info"] = {"peer": "transformers", "dtype": "float32", "batch_size": args.hf_batch_size}
    peer.close()
    return res


def subprocess_peers(args: argparse.Namespace, gguf: Optional[str]) -> list[tuple[str, PeerSpec, dict[str, Any]]]:
    """(label, spec, options) of each llama.cpp / vLLM run asked for."""
    runs = []
    if "llama" not in args.skip:
        quant = os.path.basename(gguf).split(".")[-2] if gguf else "?"
        for mode in [m.strip() for m in args.llama_modes.split(",") if m.strip()]:
            runs.append((f"llama.cpp {quant} {mode[:3]}", LLAMA, {**parse_kv(args.llama_arg), "mode": mode}))
    if "vllm" not in args.skip:
        vopts = parse_kv(args.vllm_arg)
        omp = vopts.pop("omp", "iomp")  # the OpenMP runtime the runner preloads, not an LLM keyword
        for dt in [d.strip() for d in args.vllm_dtypes.split(",") if d.strip()]:
            runs.append((f"vLLM {dt.replace('bfloat16', 'bf16').replace('float32', 'fp32')}", VLLM,
                         {"dtype": dt, "omp": omp, "llm_kwargs": vopts}))
    return runs


def same_ids(ref: dict[str, Any], res: dict[str, Any]) -> str:
    """How many requests produced exactly our greedy ids (HF: only the requests it ran)."""
    n = res.get("requests_run", len(res["outputs"]))
    return f"{sum(a == b for a, b in zip(ref['outputs'][:n], res['outputs'][:n]))}/{n}"


def main() -> None:
    args = parse_args()
    from radixserve.model.loader import default_model_path, load_config, resolve_hf_dir
    from radixserve.tokenizer import load_hf_tokenizer

    mach = machine()
    print(f"machine: {mach['cpu']}, {mach['cpus']} CPUs, flags {' '.join(mach['flags'])}; "
          f"load average {mach['loadavg'][0]:.2f}")
    if mach["loadavg"][0] > 1.5:
        print("WARNING: load average > 1.5: other processes compete for the cores, the timings will suffer")
    gguf = args.model or default_model_path()
    gguf = gguf if gguf.endswith(".gguf") else None
    hf_dir = resolve_hf_dir(args.model)
    cfg = load_config(hf_dir)
    job = build_job(args, load_hf_tokenizer(hf_dir), cfg.vocab_size)
    for w in ("shared_prefix", "sharegpt"):
        if job.get(w):
            print(f"{w}: {len(job[w]['prompts'])} requests, {sum(map(len, job[w]['prompts']))} prompt + "
                  f"{sum(job[w]['output_lens'])} output tokens")
    print()
    gemm = gemm_rates(cfg, m=args.gemm_m)
    print_gemm(gemm, args.gemm_m)
    results: dict[str, dict[str, Any]] = {}
    skipped: dict[str, str] = {}
    print("\n== radixserve (in process)")
    ours = run_radixserve(args, job)
    ours_name = f"radixserve {ours['info']['dtype'].replace('bfloat16', 'bf16').replace('float32', 'fp32')}"
    results[ours_name] = ours
    hf_name = "HF fp32" if "hf" not in args.skip else None
    if hf_name:
        print(f"\n== {hf_name} (in process, batches of {args.hf_batch_size})")
        results[hf_name] = run_hf(args, hf_dir, job)
    for name, spec, opts in subprocess_peers(args, gguf):
        python, why = find_python(spec, args.llama_python if spec is LLAMA else args.vllm_python)
        if spec is LLAMA and not gguf:
            python, why = None, "llama.cpp: needs a .gguf --model"
        if python is None:
            print(f"\n== {name}: SKIPPED. {why}")
            skipped[name] = why
            continue
        print(f"\n== {name} (subprocess: {python})")
        log = os.path.join(args.log_dir, f"bench_peers_{name.replace(' ', '_').replace('.', '')}.log")
        try:
            results[name] = run_peer(spec, python, {**job, "options": opts, "model_gguf": gguf, "hf_dir": hf_dir}, log)
        except RuntimeError as e:
            print(f"  FAILED: {e}")
            skipped[name] = str(e)
    agreement = {n: {w: same_ids(ours[w], r[w]) for w in ("shared_prefix", "sharegpt") if w in r and w in ours}
                 for n, r in results.items() if n != ours_name}
    print_table(results, agreement)
    print_ratios(results, ours_name, hf_name)
    report: dict[str, Any] = {"machine": mach, "gemm": gemm, "args": {k: (sorted(v) if isinstance(v, set) else v)
                                                        for k, v in vars(args).items()}, "skipped": skipped}
    if "shared_prefix" in ours:
        if ours["info"]["dtype"] not in gemm:
            gemm.update(gemm_rates(cfg, (ours["info"]["dtype"],), m=args.gemm_m))
        report["roofline"] = batch_roofline(cfg, job["shared_prefix"], ours, gemm, args.gemm_m)
        print_roofline(report["roofline"])
    report["bandwidth"] = decode_bandwidth(cfg, results, gguf)
    print_bandwidth(report["bandwidth"])
    for name, why in skipped.items():
        print(f"skipped {name}: {why.splitlines()[0]}")
    drop = ("outputs", "output_ids", "cached_per_request")
    report["results"] = {n: {w: ({k: v for k, v in x.items() if k not in drop} if isinstance(x, dict) else x)
                             for w, x in r.items()} for n, r in results.items()}
    report["agreement"] = agreement
    report["loadavg_end"] = list(os.getloadavg())
    write_json(args.json_out, report)


if __name__ == "__main__":
    main()
