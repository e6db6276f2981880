"""Scatter the new tokens' keys/values into their KV-pool slots (page size 1).

Layout:
  * ``k``/``v``: ``[T, Hkv, D]`` (any float dtype; token and head strides are free, the
    last dim must be contiguous: the wrapper makes it so).
  * ``k_buffer``/``v_buffer``: ``[S, Hkv, D]`` one layer of the KV pool (fp32/fp16/bf16);
    values are cast to the buffer's dtype.
  * ``loc``: int32/int64 ``[T]``: the slot of each new token.  Slot 0 is the padding
    slot, so padded tokens may point there.

A quantized pool (``kv_quant``, ``_utils.KV_FORMATS``) gets packed rows, uint8 ``[S, Hkv, D + 4]``:
per token and head ``scale = max(amax, 1e-30) / qmax`` (qmax 127, 448, 57344), the codes
``x / scale`` rounded to nearest even (int8: then clamped to +-127; fp8: on the format's grid, in
fp32 arithmetic, because triton 3.9's interpreter rounds fp32 -> fp8 wrongly where the rounding
carries into the exponent), then the fp32 scale; as ``kv_quant.quantize`` does, bit for bit.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixserve.kernels._utils import is_interpreted, kv_format, next_pow2, scale_view


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


@triton.jit
def _rne(x):
    """``x`` rounded to the nearest integer, ties to even (IEEE fp32 addition; |x| < 2**22)."""
    return (x + 12582912.0) - 12582912.0


@triton.jit
def _fp8_codes(y, KV_FORMAT: tl.constexpr):
    """fp32 ``y`` (|y| <= the format's largest value) -> its fp8 bits (uint8), rounded to nearest
    even: ``|y|`` on the format's grid, whose spacing at ``|y|`` is 2**(max(exponent, the least
    normal exponent) - mantissa bits), is exact in fp8, then the sign bit."""
    mant = 3 if KV_FORMAT == 2 else 2
    e_min = -6 if KV_FORMAT == 2 else -14
    a = tl.abs(y)
    e = tl.maximum(((a.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, e_min) - mant
    step = ((e + 127) << 23).to(tl.float32, bitcast=True)
    inv_step = ((127 - e) << 23).to(tl.float32, bitcast=True)
    r = _rne(a * inv_step) * step
    if KV_FORMAT == 2:
        bits = r.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    else:
        bits = r.to(tl.float8e5).to(tl.uint8, bitcast=True)
    sign = (y.to(tl.int32, bitcast=True) >> 24) & 0x80
    return (bits.to(tl.int32) | sign).to(tl.uint8)


@triton.jit
def _quantize_rows(x, KV_FORMAT: tl.constexpr):
    """fp32 rows ``x [H, D]`` (masked entries 0) -> ``(codes uint8 [H, D], scales fp32 [H])``."""
    qmax = 127.0 if KV_FORMAT == 1 else (448.0 if KV_FORMAT == 2 else 57344.0)
    scale = tl.math.div_rn(tl.maximum(tl.max(tl.abs(x), 1), 1e-30), qmax)
    y = tl.math.div_rn(x, scale[:, None])  # IEEE division, as torch's
    if KV_FORMAT == 1:
        codes = tl.minimum(tl.maximum(_rne(y), -127.0), 127.0).to(tl.int8).to(tl.uint8, bitcast=True)
    else:
        codes = _fp8_codes(y, KV_FORMAT)
    return codes, scale


@triton.jit
def _store_kv_quant_kernel(
    K, V, KBuf, VBuf, KScl, VScl, Loc,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kbt, stride_kbh, stride_vbt, stride_vbh,
    H, D,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, KV_FORMAT: tl.constexpr,
):
    """One program per (token, block of BLOCK_H heads): pack ``[BLOCK_H, D]`` of K and of V."""
    tok = tl.program_id(0).to(tl.int64)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask_h = offs_h < H
    mask = mask_h[:, None] & (offs_d[None, :] < D)
    slot = tl.load(Loc + tok).to(tl.int64)

    k = tl.load(K + tok * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :], mask=mask, other=0.0)
    codes, scale = _quantize_rows(k.to(tl.float32), KV_FORMAT)
    row = slot * stride_kbt + offs_h * stride_kbh
    tl.store(KBuf + row[:, None] + offs_d[None, :], codes, mask=mask)
    tl.store(KScl + (row + D) // 4, scale, mask=mask_h)
    v = tl.load(V + tok * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :], mask=mask, other=0.0)
    codes, scale = _quantize_rows(v.to(tl.float32), KV_FORMAT)
    row = slot * stride_vbt + offs_h * stride_vbh
    tl.store(VBuf + row[:, None] + offs_d[None, :], codes, mask=mask)
    tl.store(VScl + (row + D) // 4, scale, mask=mask_h)


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    loc: torch.Tensor,
    block_h: int | None = None,
    kv_quant: str | None = None,
) -> None:
    """``k_buffer[loc] = k; v_buffer[loc] = v`` (cast to the buffer dtype), in place.

    Shapes: k/v ``[T, Hkv, D]``; k_buffer/v_buffer ``[S, Hkv, D]`` with a contiguous last
    dim; loc int ``[T]`` on the same device.  Duplicate slots are not allowed (except the
    padding slot 0, whose content is unspecified afterwards).  ``kv_quant`` (int8, fp8_e4m3,
    fp8_e5m2; None: exact): the buffers are uint8 ``[S, Hkv, D + 4]`` and get packed rows.
    """
    num_tokens, num_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    assert v.shape == k.shape, (k.shape, v.shape)
    fmt = kv_format(kv_quant, (k_buffer, v_buffer), head_dim)
    assert k_buffer.shape[1:] == (num_heads, k_buffer.shape[-1] if fmt else head_dim)
    assert v_buffer.shape == k_buffer.shape
    assert k_buffer.stride(-1) == 1 and v_buffer.stride(-1) == 1
    if fmt:
        _store_quant(k, v, k_buffer, v_buffer, loc, fmt, block_h)
        return
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


def _store_quant(k, v, k_buffer, v_buffer, loc, fmt, block_h) -> None:
    num_tokens, num_heads, head_dim = k.shape
    k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (k, v))
    block_d = next_pow2(head_dim)
    if block_h is None:
        block_h = max(1, min(next_pow2(num_heads), 4096 // block_d))
    _store_kv_quant_kernel[(num_tokens, triton.cdiv(num_heads, block_h))](
        k, v, k_buffer, v_buffer, scale_view(k_buffer, fmt), scale_view(v_buffer, fmt), loc,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_buffer.stride(0), k_buffer.stride(1), v_buffer.stride(0), v_buffer.stride(1),
        num_heads, head_dim,
        BLOCK_H=block_h, BLOCK_D=block_d, KV_FORMAT=fmt,
        num_warps=4 if block_h * block_d >= 1024 else 1,
    )
