"""Small helpers shared by the Triton kernels in this package (radixserve.kernels)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


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
