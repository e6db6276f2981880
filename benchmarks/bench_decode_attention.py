"""Decode-attention micro-benchmark: µs per layer call, triton vs flashinfer vs torch_native.

One DECODE step of ``--batch`` requests with ``--context`` tokens each (slots scattered
at random over the pool, slot 0 reserved), timed per ``backend.forward`` call (KV store
+ attention of one layer) with CUDA events after a warm-up; ``init_forward_metadata``
(once per step, shared by all layers) is timed separately.  CUDA only.

    python -m benchmarks.bench_decode_attention                 # batch 64, context 2048
    python -m benchmarks.bench_decode_attention --json out.json --backends triton,flashinfer
"""
from __future__ import annotations

import argparse
import json
import math
import sys

import torch


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--num-heads", type=int, default=32)
    p.add_argument("--num-kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--backends", default="triton,flashinfer,torch_native")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--max-kv-splits", type=int, default=8, help="TritonBackend max_kv_splits")
    p.add_argument("--json", default=None, help="also write the results here")
    return p.parse_args(argv)


def build(args, dev, dtype):
    from radixserve.attention.base import ForwardBatch, ForwardMode
    from radixserve.mem_cache.kv_pool import KVPool

    torch.manual_seed(0)  # identical pool and q/k/v for every backend
    bsz, ctx = args.batch, args.context
    num_slots = bsz * ctx + 1 + 1024
    pool = KVPool(num_slots, 1, args.num_kv_heads, args.head_dim, dtype, dev)
    pool.k_buffer[0].normal_()
    pool.v_buffer[0].normal_()
    g = torch.Generator(device="cpu").manual_seed(0)
    slots = (torch.randperm(num_slots - 1, generator=g)[: bsz * ctx] + 1).to(torch.int32)
    req_to_token = torch.zeros((bsz + 8, ctx + 8), dtype=torch.int32)
    req_to_token[:bsz, :ctx] = slots.view(bsz, ctx)
    req_to_token = req_to_token.to(dev)
    seq = [ctx] * bsz
    batch = ForwardBatch(
        mode=ForwardMode.DECODE,
        input_ids=torch.zeros(bsz, dtype=torch.int64, device=dev),
        positions=torch.full((bsz,), ctx - 1, dtype=torch.int64, device=dev),
        out_cache_loc=req_to_token[:bsz, ctx - 1].long(),
        req_pool_indices=torch.arange(bsz, device=dev),
        seq_lens=torch.full((bsz,), ctx, dtype=torch.int64, device=dev),
        extend_prefix_lens=torch.full((bsz,), ctx - 1, dtype=torch.int64, device=dev),
        extend_seq_lens=torch.ones(bsz, dtype=torch.int64, device=dev),
        extend_start_loc=torch.arange(bsz, device=dev),
        req_to_token=req_to_token,
        seq_lens_cpu=seq, extend_prefix_lens_cpu=[ctx - 1] * bsz, extend_seq_lens_cpu=[1] * bsz,
    )
    q = torch.randn((bsz, args.num_heads, args.head_dim), device=dev).to(dtype)
    k = torch.randn((bsz, args.num_kv_heads, args.head_dim), device=dev).to(dtype)
    v = torch.randn_like(k)
    return pool, batch, q, k, v


def make_backend(name, pool, args):
    if name == "triton":
        from radixserve.attention.triton_backend import TritonBackend

        return TritonBackend(pool, max_kv_splits=args.max_kv_splits)
    if name == "flashinfer":
        from radixserve.attention.flashinfer_backend import FlashInferBackend

        return FlashInferBackend(pool)
    if name == "torch_native":
        from radixserve.attention.torch_native import TorchNativeBackend

        return TorchNativeBackend(pool)
    raise ValueError(f"unknown backend {name!r}")


def time_us(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000.0 / iters


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_decode_attention: CUDA is not available on this machine; this benchmark "
              "only measures GPU attention backends. Nothing was run.", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    dtype = getattr(torch, args.dtype)
    scaling = 1.0 / math.sqrt(args.head_dim)
    results, reference = [], None
    print(f"decode attention: batch={args.batch} context={args.context} heads={args.num_heads}/"
          f"{args.num_kv_heads} head_dim={args.head_dim} dtype={args.dtype} on {torch.cuda.get_device_name()}")
    for name in [b.strip() for b in args.backends.split(",") if b.strip()]:
        pool, batch, q, k, v = build(args, dev, dtype)
        try:
            be = make_backend(name, pool, args)
        except ImportError as e:
            print(f"  {name:13s} skipped: {e}")
            results.append({"backend": name, "skipped": str(e)})
            continue
        meta_us = time_us(lambda: be.init_forward_metadata(batch), 3, 20)
        be.init_forward_metadata(batch)
        out = be.forward(q, k, v, 0, scaling, batch)  # also plans / JIT-compiles
        us = time_us(lambda: be.forward(q, k, v, 0, scaling, batch), args.warmup, args.iters)
        err = None
        if reference is None:
            reference = out.float()
        else:
            err = (out.float() - reference).abs().max().item()
        # K/V bytes read per call (the bound for a memory-bound decode kernel).
        gbytes = 2 * args.batch * args.context * args.num_kv_heads * args.head_dim * pool.k_buffer[0].element_size() / 1e9
        row = {"backend": name, "us_per_call": round(us, 2), "init_metadata_us": round(meta_us, 2),
               "kv_read_GBps": round(gbytes / (us * 1e-6), 1), "max_abs_diff_vs_first": err}
        results.append(row)
        print(f"  {name:13s} {us:9.1f} us/call  ({row['kv_read_GBps']:7.1f} GB/s KV read)  "
              f"metadata {meta_us:8.1f} us/step" + ("" if err is None else f"  max|diff| vs first {err:.2e}"))
        del be, pool, batch
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": vars(args), "device": torch.cuda.get_device_name(), "results": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
