"""Placing a reused document's KV at another position (issue 46; the scheduler side is
``scheduler/documents.py``).

K is stored rotated at its absolute position: ``a * R(p * inv_freq) k`` (rotate-half pairs,
the attention factor ``a`` folded in).  Rotating a stored key by ``s * inv_freq`` gives the key
at ``p + s`` exactly in real arithmetic (rotations compose; ``a`` is a scalar), so a document
computed at positions ``0..n-1`` is placed at ``b..b+n-1`` by rotating its keys by ``b``;
in floating point the result is within a few ulps of a fresh rope at ``p + s``.  V carries no
position and is copied as it is (packed rows of a quantized pool too; K is dequantized,
rotated in fp32 and quantized again).  ``refusal`` says where this is not defined.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from radixserve.mem_cache import kv_quant
from radixserve.mem_cache.kv_pool import KVPool


def refusal(pool: KVPool, rotaries: Sequence[Any], backend: str) -> Optional[str]:
    """Why reused documents cannot be placed at other positions on this worker, or None."""
    if backend not in ("cpu", "torch_native"):
        return f"attention backend {backend!r} (documents are placed by the cpu and torch_native backends)"
    if pool.shared_kv:
        return "multi-head latent attention (its cached keys mix rotary and plain parts)"
    if pool.hybrid:
        return "sliding-window layers"
    if len(pool.held) != pool.num_layers:
        return "pipeline parallelism"
    for r in rotaries:
        if r is None or not hasattr(r, "inv_freq"):
            return "a layer without rotary position embedding"
        if not r.shift_invariant:
            return "rope_type 'longrope' past its original context (its frequencies depend on the position)"
    return None


def shift_keys(k: torch.Tensor, shift: torch.Tensor, inv_freq: torch.Tensor, rotary_dim: int) -> torch.Tensor:
    """Keys ``k [n, H, D]`` (fp32) rotated by ``shift [n]`` positions (in place; returned)."""
    half = rotary_dim // 2
    ang = shift.to(torch.float64).unsqueeze(1) * inv_freq.to(torch.float64).unsqueeze(0)  # [n, half]
    cos, sin = ang.cos().float().unsqueeze(1), ang.sin().float().unsqueeze(1)  # [n, 1, half]
    x1, x2 = k[..., :half].clone(), k[..., half:rotary_dim].clone()
    k[..., :half] = x1 * cos - x2 * sin
    k[..., half:rotary_dim] = x2 * cos + x1 * sin
    return k


def place_documents(pool: KVPool, rotaries: Sequence[Any], src: torch.Tensor, dst: torch.Tensor,
                    shift: torch.Tensor) -> None:
    """Every layer's K/V of slots ``src`` into slots ``dst`` (all int64 ``[n]``), keys moved by
    ``shift`` positions.  Rows whose shift is 0 are copied as they are (bit for bit)."""
    moved = torch.nonzero(shift != 0).squeeze(1)
    for layer in range(pool.num_layers):
        for buf in (pool.k_buffer[layer], pool.v_buffer[layer]):
            buf.index_copy_(0, dst, buf.index_select(0, src))
        if not len(moved):
            continue
        rot = rotaries[layer]
        k_buf = pool.k_buffer[layer]
        rows = k_buf.index_select(0, src.index_select(0, moved))
        k = kv_quant.dequantize(rows, pool.quant, torch.float32) if pool.quant else rows.float()
        k = shift_keys(k, shift.index_select(0, moved), rot.inv_freq, rot.rotary_dim)
        k = kv_quant.quantize(k, pool.quant) if pool.quant else k.to(pool.store_dtype)
        k_buf.index_copy_(0, dst.index_select(0, moved), k)
