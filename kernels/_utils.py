"""Small helpers shared by the Triton kernels in this package (radixserve.kernels)."""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

# The kernels' KV_FORMAT constexpr: 0 an exact pool (K/V in a float dtype); else packed rows of a
# quantized pool (radixserve.mem_cache.kv_quant, not imported here: kernels import no radixserve):
# per token and KV head, head_dim one-byte codes then the fp32 scale, value = code * scale.
from radixserve.kernels.kv_formats import KV_FORMATS


def kv_format(kv_quant: Optional[str], buffers: tuple[torch.Tensor, ...], head_dim: int) -> int:
    """The KV_FORMAT of ``kv_quant`` (None or a ``kv_quant.FORMATS`` kind), checking that quantized
    ``buffers`` hold packed rows: uint8 ``[S, Hkv, head_dim + 4]``, contiguous rows."""
    if kv_quant not in KV_FORMATS:
        raise ValueError(f"unknown KV format {kv_quant!r} (one of {sorted(k for k in KV_FORMATS if k)})")
    if kv_quant is not None:
        assert head_dim % 4 == 0, head_dim
        for b in buffers:
            assert b.dtype == torch.uint8 and b.shape[-1] == head_dim + 4, (b.dtype, b.shape, head_dim)
            assert b.stride(-1) == 1 and all(s % 4 == 0 for s in b.stride()[:-1]), b.stride()
    return KV_FORMATS[kv_quant]


def scale_view(buf: torch.Tensor, fmt: int) -> torch.Tensor:
    """The fp32 view of a packed-row buffer (the kernels read and write the scales through it;
    the scale of the row at byte offset ``o`` is element ``(o + head_dim) // 4``); an exact
    pool's buffer as it is (unused)."""
    return buf.view(torch.float32) if fmt else buf


def is_interpreted(kernel) -> bool:
    """True when ``kernel`` runs on Triton's CPU interpreter.  Triton decides this when the
    ``@triton.jit`` decorator runs (``TRITON_INTERPRET=1`` at import time), so ask the
    kernel object rather than the environment."""
    return type(kernel).__name__ == "InterpretedFunction"


def dot_flags(dtype: torch.dtype, kernel) -> tuple[bool, bool]:
    """``(UPCAST, IEEE)`` constexprs for :func:`_dot` when launching ``kernel``.

    UPCAST: triton 3.9's interpreter computes a bf16 x bf16 ``tl.dot`` on the raw bit
    patterns (garbage), so under the interpreter both operands are upcast to fp32.
    IEEE: fp32 inputs use exact fp32 products on the GPU instead of TF32.
    """
    return is_interpreted(kernel), dtype == torch.float32


def next_pow2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))


@triton.jit
def _dot(a, b, UPCAST: tl.constexpr, IEEE: tl.constexpr):
    """``a @ b`` accumulated in fp32 (see :func:`dot_flags`)."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    elif IEEE:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def _online_softmax_step(qk, v, m_i, l_i, acc, UPCAST: tl.constexpr, IEEE: tl.constexpr):
    """Fold one masked score tile ``qk [M, N]`` (-inf = masked) and ``v [N, D]`` into the
    running max ``m_i``, denominator ``l_i`` and numerator ``acc`` (all fp32)."""
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(qk - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, UPCAST, IEEE)
    return m_new, l_i, acc


@triton.jit
def _paged_kv_tile(Row, offs_n, mask_n, KBuf, VBuf, kvh, offs_d, mask_d,
                   stride_kbt, stride_kbh, stride_vbt, stride_vbh, dt):
    """``K^T [D, N]`` and ``V [N, D]`` of the positions ``offs_n`` of one request, gathered from
    the pool through its request-to-token row ``Row`` (masked positions read slot 0)."""
    slots = tl.load(Row + offs_n, mask=mask_n, other=0).to(tl.int64)
    k = tl.load(
        KBuf + slots[None, :] * stride_kbt + kvh * stride_kbh + offs_d[:, None],
        mask=mask_n[None, :] & mask_d[:, None], other=0.0,
    ).to(dt)
    v = tl.load(
        VBuf + slots[:, None] * stride_vbt + kvh * stride_vbh + offs_d[None, :],
        mask=mask_n[:, None] & mask_d[None, :], other=0.0,
    ).to(dt)
    return k, v


@triton.jit
def _decode_codes(c, KV_FORMAT: tl.constexpr):
    """uint8 codes of a packed row -> their values in fp32."""
    if KV_FORMAT == 1:
        return c.to(tl.int8, bitcast=True).to(tl.float32)
    elif KV_FORMAT == 2:
        return c.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    else:
        return c.to(tl.float8e5, bitcast=True).to(tl.float32)


@triton.jit
def _paged_kv_tile_q(Row, offs_n, mask_n, KBuf, VBuf, KScl, VScl, kvh, offs_d, mask_d,
                     stride_kbt, stride_kbh, stride_vbt, stride_vbh, D, dt, KV_FORMAT: tl.constexpr):
    """:func:`_paged_kv_tile` over packed rows (uint8 ``KBuf``/``VBuf``, their fp32 views
    ``KScl``/``VScl``): each row's ``code * scale`` in fp32, rounded to ``dt`` (what
    ``kv_quant.dequantize`` gives); masked positions read 0."""
    slots = tl.load(Row + offs_n, mask=mask_n, other=0).to(tl.int64)
    k_row = slots * stride_kbt + kvh * stride_kbh
    k = _decode_codes(tl.load(KBuf + k_row[None, :] + offs_d[:, None], mask=mask_n[None, :] & mask_d[:, None],
                              other=0), KV_FORMAT)
    k_scale = tl.load(KScl + (k_row + D) // 4, mask=mask_n, other=0.0)
    v_row = slots * stride_vbt + kvh * stride_vbh
    v = _decode_codes(tl.load(VBuf + v_row[:, None] + offs_d[None, :], mask=mask_n[:, None] & mask_d[None, :],
                              other=0), KV_FORMAT)
    v_scale = tl.load(VScl + (v_row + D) // 4, mask=mask_n, other=0.0)
    return (k * k_scale[None, :]).to(dt), (v * v_scale[:, None]).to(dt)


@triton.jit
def _attend_paged(q, m_i, l_i, acc, Row, lo, hi, limit, KBuf, VBuf, kvh, offs_d, mask_d,
                  stride_kbt, stride_kbh, stride_vbt, stride_vbh, sm_scale,
                  BLOCK_N: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr):
    """Fold the cached positions ``[lo, hi)`` (those ``>= limit`` masked) of one request into the
    online softmax of the query tile ``q [M, D]``; returns the new ``(m_i, l_i, acc)``."""
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        mask_n = offs_n < limit
        k, v = _paged_kv_tile(Row, offs_n, mask_n, KBuf, VBuf, kvh, offs_d, mask_d,
                              stride_kbt, stride_kbh, stride_vbt, stride_vbh, q.dtype)
        qk = _dot(q, k, UPCAST, IEEE) * sm_scale
        qk = tl.where(mask_n[None, :], qk, float("-inf"))
        m_i, l_i, acc = _online_softmax_step(qk, v, m_i, l_i, acc, UPCAST, IEEE)
    return m_i, l_i, acc
