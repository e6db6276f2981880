"""What the native CPU attention kernel's tests share (tests/kernels/test_attention_cpu*.py):
the fp64 reference check, running ``CpuBackend`` with or without AVX512-BF16 dot products,
selecting the kernel's bf16 path, and batches of given cached/new lengths.  The kernel must
be loaded (``cpu_native.load()``) before anything here runs it."""
from __future__ import annotations

import dataclasses
import random

import torch

from radixserve.attention.base import ForwardBatch, ForwardMode
from radixserve.attention.cpu_backend import CpuBackend
from radixserve.mem_cache.kv_pool import KVPool

from tests.helpers.attention_cases import rows_case
from tests.helpers.attention_reference import attention_reference

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
DOT = {"on": False}  # run_cpu's backends: AVX512-BF16 dot products for bf16 blocks not on AMX


def reference(q: torch.Tensor, pool: KVPool, batch: ForwardBatch, scaling: float) -> torch.Tensor:
    """Per-request dense attention in fp64 over layer 0 of the pool."""
    return attention_reference(q, pool.k_buffer[0], pool.v_buffer[0], batch, scaling, torch.float64)


def check(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    err = (out.double() - ref).abs().max().item()
    assert err <= TOL[dtype], f"max abs error {err:.3g} > {TOL[dtype]}"


def run_cpu(pool: KVPool, batch: ForwardBatch, q: torch.Tensor):
    """(layer-0 output of a fresh ``CpuBackend``, its plan); dot products as ``DOT`` says."""
    be = CpuBackend(pool, dataclasses.replace(CpuBackend.default_rule(pool), bf16_dot=DOT["on"]))
    be.init_forward_metadata(batch)
    return be.attend(q, None, None, 0, q.shape[-1] ** -0.5, batch), batch.attn_metadata


def set_bf16_mode(mode: int) -> int:
    """Selects the kernel's path for bf16 pools (0 fp32 tiles, 1 AVX-512 bf16 tiles, 2 with AMX
    blocks); returns the mode this build and CPU allow (capped)."""
    return int(torch.ops.radixserve_cpu.attention_bf16_mode(mode))


def make_lengths_case(prefix_lens, ext_lens, heads, kv_heads, d, dtype, seed=0, shared_prefix=0):
    """(pool, batch, q) with the given cached/new lengths per request; the first
    ``shared_prefix`` slots of every request with that many cached tokens are common (one
    shared group)."""
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    slots = 4000
    pool = KVPool(slots, 1, kv_heads, d, dtype)
    free = list(range(1, slots))
    rng.shuffle(free)
    common = [free.pop() for _ in range(shared_prefix)]
    rows = []
    for p, n in zip(prefix_lens, ext_lens):
        base = common[:p] if shared_prefix and p >= shared_prefix else []
        base = base + [free.pop() for _ in range(p - len(base))]
        rows.append(base + [free.pop() for _ in range(n)])
    mode = ForwardMode.DECODE if all(n == 1 for n in ext_lens) else ForwardMode.EXTEND
    batch, q = rows_case(pool, mode, rows, list(prefix_lens), list(ext_lens), heads, gen)
    return pool, batch, q
