"""The native CPU attention kernel's bf16-pool paths at long contexts, per step kind.

One layer (``--heads``/``--kv-heads``/``--head-dim``, bf16 pool) timed through ``CpuBackend``
(plan + kernel, no dense blocks) in every ``attention_bf16_mode`` the CPU allows (0: generic
fp32 tiles, 1: AVX-512 bf16 tiles, 2: with AMX blocks), each with and without AVX512-BF16 dot
products, on: a 2,048-token prefill chunk after ``--context`` - 2,048 cached tokens, a causal
2,048-token prompt, a decode step of 4 requests sharing ``--context`` cached tokens, and a
decode step of one request at ``--context``.  Best of 2 calls, ms per layer.  The engine runs
the highest mode the CPU allows and times only the dot products (attention_timing.py).

    .venv/bin/python -m benchmarks.bench_attention_modes --context 16384
"""
from __future__ import annotations

import argparse

import torch

from radixserve.attention.cpu_backend import DenseRule
from radixserve.kernels import cpu_native
from radixserve.mem_cache.kv_pool import KVPool
from radixserve.utils import tune_malloc
from radixserve.worker.tuning.attention_timing import NEVER, _batch, _time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--context", type=int, default=16384)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    args = p.parse_args()
    tune_malloc()
    if not cpu_native.load():
        raise SystemExit("the native CPU kernel did not build here")
    ctx = args.context
    pool = KVPool(ctx + 2048 + 64, 1, args.kv_heads, args.head_dim, torch.bfloat16)
    pool.k_buffer[0].normal_()
    pool.v_buffer[0].normal_()
    mode_op, dot_op = torch.ops.radixserve_cpu.attention_bf16_mode, torch.ops.radixserve_cpu.attention_bf16_dot
    best, dot_was = int(mode_op(-1)), int(dot_op(-1))
    cases = {f"prefill chunk 2048 after {ctx - 2048}": (ctx - 2048, [2048]), "causal prompt 2048": (0, [2048]),
             f"decode, 4 sharing {ctx}": (ctx, [1] * 4), f"decode, 1 at {ctx}": (ctx, [1])}
    print(f"{torch.get_num_threads()} threads, H={args.heads} Hkv={args.kv_heads} D={args.head_dim}, ms per layer")
    try:
        for name, (prefix, new) in cases.items():
            batch, cells = _batch(prefix, new, pool), []
            for mode in range(best + 1):
                mode_op(mode)
                for dot in (0, 1):
                    t = min(_time(pool, batch, args.heads, DenseRule(NEVER, NEVER, bool(dot))) for _ in range(2))
                    cells.append(f"mode {mode} dot {dot}: {t * 1e3:8.2f}")
            print(f"{name:<32}" + " | ".join(cells), flush=True)
    finally:
        mode_op(best)
        dot_op(dot_was)


if __name__ == "__main__":
    main()
