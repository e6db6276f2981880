"""Builders and checks shared by the attention tests (tests/kernels/): pools with random K/V,
the ``ForwardBatch`` of a step over paged rows, and a tolerance check that names what it
compares."""
from __future__ import annotations

from typing import Optional, Sequence, Union

import torch

from radixserve.attention.base import ForwardBatch, ForwardMode
from radixserve.mem_cache.kv_pool import KVPool

Device = Union[torch.device, str]


def paged_batch(mode: ForwardMode, req_to_token: torch.Tensor, req_rows, prefix_lens: Sequence[int],
                ext_lens: Sequence[int], out_loc) -> ForwardBatch:
    """The step's batch on ``req_to_token``'s device: request ``i`` sits in row ``req_rows[i]``
    (its slots already written there) with ``prefix_lens[i]`` cached and ``ext_lens[i]`` new
    tokens, whose slots are ``out_loc`` (packed request after request)."""
    dev = req_to_token.device
    seq = [p + n for p, n in zip(prefix_lens, ext_lens)]
    ext = torch.tensor(ext_lens, dtype=torch.int64, device=dev)
    return ForwardBatch(
        mode=mode,
        input_ids=torch.zeros(sum(ext_lens), dtype=torch.int64, device=dev),
        positions=torch.cat([torch.arange(p, s) for p, s in zip(prefix_lens, seq)]).to(dev),
        out_cache_loc=torch.as_tensor(out_loc).to(dev, torch.int64),
        req_pool_indices=torch.as_tensor(req_rows).to(dev, torch.int64),
        seq_lens=torch.tensor(seq, dtype=torch.int64, device=dev),
        extend_prefix_lens=torch.tensor(prefix_lens, dtype=torch.int64, device=dev),
        extend_seq_lens=ext,
        extend_start_loc=torch.cumsum(ext, 0) - ext,
        req_to_token=req_to_token,
        seq_lens_cpu=seq, extend_prefix_lens_cpu=list(prefix_lens), extend_seq_lens_cpu=list(ext_lens),
    )


def random_pool(num_slots: int, num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                gen: torch.Generator, device: Device = "cpu") -> KVPool:
    """A pool whose every slot of every layer holds random K/V (drawn on the CPU from ``gen``)."""
    pool = KVPool(num_slots, num_layers, num_kv_heads, head_dim, dtype, device)
    for layer in range(num_layers):
        pool.k_buffer[layer].copy_(torch.randn(pool.k_buffer[layer].shape, generator=gen))
        pool.v_buffer[layer].copy_(torch.randn(pool.v_buffer[layer].shape, generator=gen))
    return pool


def clone_pool(pool: KVPool) -> KVPool:
    """A copy of ``pool`` (same shape, dtype, device and values)."""
    other = KVPool(pool.num_slots, pool.num_layers, pool.num_kv_heads, pool.head_dim, pool.dtype, pool.device)
    for layer in range(pool.num_layers):
        other.k_buffer[layer].copy_(pool.k_buffer[layer])
        other.v_buffer[layer].copy_(pool.v_buffer[layer])
    return other


def random_qkv(num_tokens: int, num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
               gen: torch.Generator, device: Device = "cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random q, k, v of a step's new tokens (drawn on the CPU from ``gen``, in that order)."""
    return tuple(torch.randn((num_tokens, h, head_dim), generator=gen).to(device, dtype)
                 for h in (num_heads, num_kv_heads, num_kv_heads))


def rows_case(pool: KVPool, mode: ForwardMode, rows: list[list[int]], prefix_lens: list[int], ext_lens: list[int],
              num_heads: int, gen: torch.Generator, table_rows: Optional[list[int]] = None
              ) -> tuple[ForwardBatch, torch.Tensor]:
    """(batch, q) of layer 0 of a CPU ``pool``: random K/V (from ``gen``) at every slot of
    ``rows``; request ``i``'s slots ``rows[i]`` (its last ``ext_lens[i]`` the new tokens') in row
    ``table_rows[i]`` (default ``i``) of an int32 table; random q for the new tokens."""
    used = torch.tensor(sorted({s for r in rows for s in r}))
    shape = (len(used), pool.num_kv_heads, pool.head_dim)
    pool.k_buffer[0][used] = torch.randn(shape, generator=gen).to(pool.dtype)
    pool.v_buffer[0][used] = torch.randn(shape, generator=gen).to(pool.dtype)
    table_rows = list(range(len(rows))) if table_rows is None else table_rows
    table = torch.zeros(max(table_rows) + 1, max(len(r) for r in rows) + 5, dtype=torch.int32)
    for t, r in zip(table_rows, rows):
        table[t, : len(r)] = torch.tensor(r, dtype=torch.int32)
    new_slots = [s for r, p in zip(rows, prefix_lens) for s in r[p:]]
    q = torch.randn(sum(ext_lens), num_heads, pool.head_dim, generator=gen).to(pool.dtype)
    return paged_batch(mode, table, table_rows, prefix_lens, ext_lens, new_slots), q


def assert_close(out: torch.Tensor, ref: torch.Tensor, what: str, atol: float, rtol: float) -> None:
    """``torch.testing.assert_close`` in fp32, the message naming ``what``, out's dtype and the
    tolerances."""
    torch.testing.assert_close(out.float(), ref.float(), atol=atol, rtol=rtol,
                               msg=lambda m: f"{what} ({out.dtype}, atol={atol}, rtol={rtol}): {m}")


def layered_case(prefix_lens: Sequence[int], ext_lens: Sequence[int], num_heads: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, num_layers: int = 1, shared_prefix: int = 0, seed: int = 0
                 ) -> tuple[KVPool, ForwardBatch, torch.Tensor]:
    """(pool, batch, q) of one step on the CPU: random K/V at every slot of every layer (the new
    tokens' included), request ``i`` with ``prefix_lens[i]`` cached and ``ext_lens[i]`` new tokens
    at shuffled slots, in table row ``i + 1``; requests with at least ``shared_prefix`` cached
    tokens share their first ``shared_prefix`` slots (one radix hit).  DECODE when every request
    has one new token."""
    gen = torch.Generator().manual_seed(seed)
    seq = [p + n for p, n in zip(prefix_lens, ext_lens)]
    num_slots = sum(seq) + shared_prefix + 8
    pool = random_pool(num_slots, num_layers, num_kv_heads, head_dim, dtype, gen)
    free = (torch.randperm(num_slots - 1, generator=gen) + 1).tolist()
    common = [free.pop() for _ in range(shared_prefix)]
    table = torch.zeros(len(seq) + 1, max(seq) + 3, dtype=torch.int32)
    new_slots = []
    for i, (p, n) in enumerate(zip(prefix_lens, ext_lens)):
        row = (common if shared_prefix and p >= shared_prefix else [])[:p]
        row = row + [free.pop() for _ in range(p + n - len(row))]
        table[i + 1, : p + n] = torch.tensor(row, dtype=torch.int32)
        new_slots += row[p:]
    mode = ForwardMode.DECODE if all(n == 1 for n in ext_lens) else ForwardMode.EXTEND
    batch = paged_batch(mode, table, list(range(1, len(seq) + 1)), list(prefix_lens), list(ext_lens), new_slots)
    q = torch.randn(sum(ext_lens), num_heads, head_dim, generator=gen).to(dtype)
    return pool, batch, q


def decode_after(batch: ForwardBatch, pool: KVPool) -> ForwardBatch:
    """The DECODE step after ``batch``: one more token per request, in never-used slots of ``pool``
    (written into ``batch.req_to_token``)."""
    used = set(batch.req_to_token[batch.req_pool_indices].flatten().tolist())
    free = [s for s in range(1, pool.num_slots) if s not in used][: batch.batch_size]
    seq = [n + 1 for n in batch.seq_lens_cpu]
    for i, s in enumerate(free):
        batch.req_to_token[batch.req_pool_indices[i], seq[i] - 1] = s
    return paged_batch(ForwardMode.DECODE, batch.req_to_token, batch.req_pool_indices, [n - 1 for n in seq],
                       [1] * batch.batch_size, free)
