"""Per-layer cost of the native CPU attention kernel at decode shapes, per bf16 path.

The kernel alone (``step_attention``'s single call per layer, the plan built once) for
``--batches`` requests each attending to ``--contexts`` cached keys (random slots, no shared
prefix), SmolLM2's heads by default, for every ``attention_bf16_mode`` this build allows
(0 generic fp32 tiles, 1 AVX-512 bf16, 2 with AMX blocks).  Each pass runs ``--layers``
layers after reading ``--flush-mb`` of memory, so that K/V are not hot in L2.  Prints µs per layer call and
µs per (request, KV head).  Run it under ``flock /tmp/rs-heavy.lock`` on shared machines.

    .venv/bin/python -m benchmarks.bench_attention_step_cpu --batches 1 64 --contexts 40 600
"""
from __future__ import annotations

import argparse
import time

import torch

from benchmarks.bench_attention_cpu import make_batch

from radixserve.attention.cpu_backend import CpuBackend
from radixserve.kernels import cpu_native
from radixserve.mem_cache.kv_pool import KVPool
from radixserve.utils import tune_malloc


DECODED = 8  # --layout engine: keys of each context written by decode steps (one slot per request a step)


def time_step(bsz: int, ctx: int, heads: int, kv_heads: int, dim: int, dtype: torch.dtype, reps: int,
              layers: int, flush: torch.Tensor, layout: str) -> float:
    """Seconds for one layer's kernel call: ``bsz`` decode tokens over ``ctx`` keys each, the
    best of ``reps`` passes over ``layers`` layers, with ``flush`` read between passes (as a
    model's weights would be): the K/V come from L3 or memory, as in a decode step."""
    slots = bsz * ctx + 2
    pool = KVPool(slots, layers, kv_heads, dim, dtype)
    for buf in pool.k_buffer + pool.v_buffer:
        buf.normal_()
    batch = make_batch(bsz, 1, ctx - 1, 0, 1, False, slots)
    if layout == "engine":  # each prompt's slots contiguous, the last DECODED keys one per step for all
        dec = min(DECODED, ctx - 1)
        prompt = torch.arange(bsz * (ctx - dec)).view(bsz, ctx - dec) + 1
        steps = torch.arange(bsz * dec).view(dec, bsz).t() + 1 + bsz * (ctx - dec)
        batch.req_to_token.copy_(torch.cat([prompt, steps], 1).to(torch.int32))
        batch.out_cache_loc.copy_(batch.req_to_token[:, -1].long())
    be = CpuBackend(pool)
    be.init_forward_metadata(batch)
    attend = be.step_attention(batch, heads)
    q = torch.randn(bsz, heads, dim).to(dtype)
    scale = dim ** -0.5
    best = float("inf")
    for _ in range(reps + 1):
        flush.sum()
        t = time.perf_counter()
        for layer in range(layers):
            attend(q, layer, scale)
        best = min(best, time.perf_counter() - t)
    return best / layers


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    p.add_argument("--contexts", type=int, nargs="+", default=[40, 600])
    p.add_argument("--heads", type=int, default=9)
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--modes", type=int, nargs="*", default=None, help="bf16 modes to time (default: all allowed)")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--layout", default="engine", choices=["engine", "random"],
                   help="slots: prompts contiguous + the last decoded keys interleaved, or all at random")
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--flush-mb", type=int, default=512, help="MB read between passes (0: none, a hot cache)")
    args = p.parse_args()
    tune_malloc()
    if not cpu_native.load():
        raise SystemExit("the native CPU kernel did not build here")
    dtype = getattr(torch, args.dtype)
    flush = torch.ones(max(1, args.flush_mb << 18))
    mode_op = torch.ops.radixserve_cpu.attention_bf16_mode
    best = int(mode_op(-1))
    modes = args.modes if args.modes is not None else list(range(best + 1))
    if dtype != torch.bfloat16:
        modes = [best]
    print(f"{torch.get_num_threads()} threads, {args.dtype}, H={args.heads} Hkv={args.kv_heads} D={args.head_dim}")
    print(f"{'mode':>4} {'batch':>5} {'keys':>5} {'us/layer':>9} {'us/(req,kvh)':>13}")
    try:
        for mode in modes:
            if dtype == torch.bfloat16:
                mode_op(mode)
            for bsz in args.batches:
                for ctx in args.contexts:
                    t = time_step(bsz, ctx, args.heads, args.kv_heads, args.head_dim, dtype, args.reps,
                                  args.layers, flush, args.layout)
                    per = t * 1e6 / (bsz * args.kv_heads) * torch.get_num_threads()
                    print(f"{mode:>4} {bsz:>5} {ctx:>5} {t * 1e6:>9.1f} {per:>13.2f}", flush=True)
    finally:
        mode_op(best)


if __name__ == "__main__":
    main()
