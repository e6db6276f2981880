"""Per-layer cost of CPU attention: the native kernel (``cpu``) against ``torch_native``.

Decode at batch 1/16/128 and extend (64 new tokens per request), each with the requests'
prompts sharing ``--groups`` system prompts of ``--prefix`` tokens or not sharing at all,
plus ``--suffix`` private tokens; SmolLM2's shapes by default (9 query heads, 3 KV heads,
dim 64), in the pool dtype ``--dtype``.  Prints µs per layer call and, for the native
kernel, the achieved bandwidth: the K/V bytes a kernel that reads every distinct slot once
must move (shared prefixes counted once) ÷ time, against the machine's read bandwidth
measured in the same run (a sum over a 1 GiB tensor).

    .venv/bin/python -m benchmarks.bench_attention_cpu [--dtype bfloat16]
"""
from __future__ import annotations

import argparse
import platform

import torch

from radixserve.attention.base import ForwardBatch, ForwardMode
from radixserve.attention.cpu_backend import CpuBackend
from radixserve.attention.torch_native import TorchNativeBackend
from radixserve.kernels import cpu_native
from radixserve.mem_cache.kv_pool import KVPool
from radixserve.utils import tune_malloc
from radixserve.worker.tuning.kernel_timing import best_time


def make_batch(bsz: int, groups: int, prefix: int, suffix: int, new: int, shared: bool, slots: int) -> ForwardBatch:
    """``bsz`` requests of ``prefix + suffix`` cached tokens (the prefix shared by group when
    ``shared``) plus ``new`` tokens computed in this step."""
    g = torch.Generator().manual_seed(0)
    perm = (torch.randperm(slots - 1, generator=g) + 1).tolist()
    pos = 0

    def take(n: int) -> list[int]:
        nonlocal pos
        pos += n
        return perm[pos - n: pos]

    commons = [take(prefix) for _ in range(groups if shared else 0)]
    rows = [(commons[b % groups] if shared else take(prefix)) + take(suffix + new) for b in range(bsz)]
    width = prefix + suffix + new
    table = torch.tensor(rows, dtype=torch.int32)
    seq = torch.full((bsz,), width, dtype=torch.int64)
    ext = torch.full((bsz,), new, dtype=torch.int64)
    mode = ForwardMode.DECODE if new == 1 else ForwardMode.EXTEND
    positions = torch.arange(width - new, width).repeat(bsz)
    locs = torch.tensor([s for r in rows for s in r[-new:]])
    return ForwardBatch(mode, torch.zeros(bsz * new, dtype=torch.long), positions, locs, torch.arange(bsz), seq,
                        seq - ext, ext, torch.cumsum(ext, 0) - ext, table, seq.tolist(), (seq - ext).tolist(),
                        ext.tolist())


def read_bandwidth() -> float:
    x = torch.ones(1 << 28)  # 1 GiB of fp32
    return x.numel() * 4 / best_time(lambda: x.sum(), 5) / 1e9


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--heads", type=int, default=9)
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--groups", type=int, default=16)
    p.add_argument("--prefix", type=int, default=512)
    p.add_argument("--suffix", type=int, default=64)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--iters", type=int, default=10)
    args = p.parse_args()
    tune_malloc()
    if not cpu_native.load():
        raise SystemExit("the native CPU kernel did not build here (see the warning above)")
    dtype = getattr(torch, args.dtype)
    bw = read_bandwidth()
    print(f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, {args.dtype}; "
          f"read bandwidth {bw:.1f} GB/s; H={args.heads} Hkv={args.kv_heads} D={args.head_dim}; prefix "
          f"{args.prefix} (+{args.suffix} private), {args.groups} groups when shared")
    print(f"{'mode':>7} {'batch':>5} {'shared':>6} {'native us':>10} {'torch us':>10} {'speedup':>8} {'native GB/s':>12}")
    elem = torch.tensor([], dtype=dtype).element_size()
    for new in (1, 64):
        for bsz in (1, 16, 128):
            for shared in (False, True):
                if shared and bsz == 1:
                    continue
                groups = min(args.groups, bsz)
                slots = (groups if shared else bsz) * args.prefix + bsz * (args.suffix + new) + 2
                pool = KVPool(slots, 1, args.kv_heads, args.head_dim, dtype)
                pool.k_buffer[0].normal_()
                pool.v_buffer[0].normal_()
                batch = make_batch(bsz, groups, args.prefix, args.suffix, new, shared, slots)
                q = torch.randn(bsz * new, args.heads, args.head_dim).to(dtype)
                res = {}
                for name, cls in (("native", CpuBackend), ("torch", TorchNativeBackend)):
                    be = cls(pool)
                    be.init_forward_metadata(batch)
                    res[name] = best_time(lambda: be.attend(q, None, None, 0, args.head_dim ** -0.5, batch), args.iters)
                distinct = (groups * args.prefix if shared else bsz * args.prefix) + bsz * (args.suffix + new)
                gbs = distinct * 2 * args.kv_heads * args.head_dim * elem / res["native"] / 1e9
                print(f"{'decode' if new == 1 else 'extend':>7} {bsz:>5} {str(shared):>6} {res['native'] * 1e6:>10.0f} "
                      f"{res['torch'] * 1e6:>10.0f} {res['torch'] / res['native']:>7.2f}x {gbs:>12.1f}")


if __name__ == "__main__":
    main()
