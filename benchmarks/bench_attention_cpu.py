"""Per-layer cost of the torch-native attention backend on the CPU.

Decode steps over a paged pool for growing batch sizes, with ``groups`` shared prefixes of
``prefix`` tokens plus ``suffix`` private tokens per request; cascade (shared-prefix)
attention on and off.  Time per call should grow with the bytes touched, not with a Python
loop over requests.

    .venv/bin/python benchmarks/bench_attention_cpu.py
"""
from __future__ import annotations

import argparse
import time

import torch

from radixserve.attention.base import ForwardBatch, ForwardMode
from radixserve.attention.torch_native import TorchNativeBackend
from radixserve.mem_cache.kv_pool import KVPool
from radixserve.utils import tune_malloc


def decode_batch(bsz: int, groups: int, prefix: int, suffix: int, slots: int) -> tuple[ForwardBatch, list[int]]:
    g = torch.Generator().manual_seed(0)
    perm = (torch.randperm(slots - 1, generator=g) + 1).tolist()
    shared = [perm[i * prefix:(i + 1) * prefix] for i in range(groups)]
    pos = groups * prefix
    rows, new = [], []
    for b in range(bsz):
        own = perm[pos: pos + suffix]
        pos += suffix
        rows.append(shared[b % groups] + own)
        new.append(own[-1])
    table = torch.zeros(bsz, prefix + suffix, dtype=torch.int32)
    for i, r in enumerate(rows):
        table[i] = torch.tensor(r, dtype=torch.int32)
    seq = torch.full((bsz,), prefix + suffix, dtype=torch.int64)
    ones = torch.ones(bsz, dtype=torch.int64)
    batch = ForwardBatch(ForwardMode.DECODE, torch.zeros(bsz, dtype=torch.long), seq - 1, torch.tensor(new),
                         torch.arange(bsz), seq, seq - 1, ones, torch.arange(bsz), table,
                         seq.tolist(), (seq - 1).tolist(), ones.tolist())
    return batch, new


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--heads", type=int, default=9)
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--groups", type=int, default=16)
    p.add_argument("--prefix", type=int, default=512)
    p.add_argument("--suffix", type=int, default=96)
    p.add_argument("--iters", type=int, default=10)
    args = p.parse_args()
    tune_malloc()
    print(f"decode, {args.groups} shared prefixes of {args.prefix} + {args.suffix} private tokens, "
          f"H={args.heads} Hkv={args.kv_heads} D={args.head_dim}, fp32, {torch.get_num_threads()} threads")
    print(f"{'batch':>6} {'plain ms':>9} {'cascade ms':>11} {'speedup':>8} {'plain us/req':>13}")
    for bsz in (16, 32, 64, 128):
        slots = args.groups * args.prefix + bsz * args.suffix + 2
        pool = KVPool(slots, 1, args.kv_heads, args.head_dim, torch.float32)
        pool.k_buffer[0].normal_()
        pool.v_buffer[0].normal_()
        batch, _ = decode_batch(bsz, args.groups, args.prefix, args.suffix, slots)
        q = torch.randn(bsz, args.heads, args.head_dim)
        k = torch.randn(bsz, args.kv_heads, args.head_dim)
        backend = TorchNativeBackend(pool)
        res = {}
        for use in (False, True):
            backend.use_cascade = use
            backend.init_forward_metadata(batch)
            for _ in range(2):
                backend.forward(q, k, k, 0, args.head_dim ** -0.5, batch)
            t = time.perf_counter()
            for _ in range(args.iters):
                backend.forward(q, k, k, 0, args.head_dim ** -0.5, batch)
            res[use] = (time.perf_counter() - t) / args.iters * 1e3
        print(f"{bsz:>6} {res[False]:>9.2f} {res[True]:>11.2f} {res[False] / res[True]:>7.2f}x "
              f"{res[False] * 1e3 / bsz:>13.1f}")


if __name__ == "__main__":
    main()
