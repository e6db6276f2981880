"""Scatter the new tokens' keys/values into their KV-pool slots (page size 1).

Layout:
  * ``k``/``v``: ``[T, Hkv, D]`` (any float dtype; token and head strides are free, the
    last dim must be contiguous: the wrapper makes it so).
  * ``k_buffer``/``v_buffer``: ``[S, Hkv, D]`` one layer of the KV pool (fp32/fp16/bf16);
    values are cast to the buffer's dtype.
  * ``loc``: int32/int64 ``[T]``: the slot of each new token.  Slot 0 is the padding
    slot, so padded tokens may point there.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixserve.kernels._utils import is_interpreted, next_pow2


@triton.jit
def _store_kv_kernel(
    K, V, KBuf, VBuf, Loc,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kbt, stride_kbh, stride_vbt, stride_vbh,
    H, D,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """One program per (token, block of BLOCK_H heads): copy ``[BLOCK_H, D]`` of K and V."""
    tok = tl.program_id(0).to(tl.int64)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_h[:, None] < H) & (offs_d[None, :] < D)
    slot = tl.load(Loc + tok).to(tl.int64)

    k = tl.load(K + tok * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :], mask=mask)
    tl.store(
        KBuf + slot * stride_kbt + offs_h[:, None] * stride_kbh + offs_d[None, :],
        k.to(KBuf.dtype.element_ty), mask=mask,
    )
    v = tl.load(V + tok * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :], mask=mask)
    tl.store(
        VBuf + slot * stride_vbt + offs_h[:, None] * stride_vbh + offs_d[None, :],
        v.to(VBuf.dtype.element_ty), mask=mask,
    )


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    loc: torch.Tensor,
    block_h: int | None = None,
) -> None:
    """``k_buffer[loc] = k; v_buffer[loc] = v`` (cast to the buffer dtype), in place.

    Shapes: k/v ``[T, Hkv, D]``; k_buffer/v_buffer ``[S, Hkv, D]`` with a contiguous last
    dim; loc int ``[T]`` on the same device.  Duplicate slots are not allowed (except the
    padding slot 0, whose content is unspecified afterwards).
    """
    num_tokens, num_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    assert v.shape == k.shape, (k.shape, v.shape)
    assert k_buffer.shape[1:] == (num_heads, head_dim) and v_buffer.shape == k_buffer.shape
    assert k_buffer.stride(-1) == 1 and v_buffer.stride(-1) == 1
    if is_interpreted(_store_kv_kernel) and k.dtype != k_buffer.dtype:
        # triton 3.9's interpreter rounds fp32 -> bf16 toward zero (GPUs round to nearest
        # even, like torch): cast with torch so that both paths store identical bits.
        k, v = k.to(k_buffer.dtype), v.to(v_buffer.dtype)
    if k.stride(-1) != 1:
        k = k.contiguous()
    if v.stride(-1) != 1:
        v = v.contiguous()
    block_d = next_pow2(head_dim)
    if block_h is None:
        block_h = max(1, min(next_pow2(num_heads), 4096 // block_d))
    grid = (num_tokens, triton.cdiv(num_heads, block_h))
    _store_kv_kernel[grid](
        k, v, k_buffer, v_buffer, loc,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_buffer.stride(0), k_buffer.stride(1), v_buffer.stride(0), v_buffer.stride(1),
        num_heads, head_dim,
        BLOCK_H=block_h, BLOCK_D=block_d,
        num_warps=4 if block_h * block_d >= 1024 else 1,
    )
