"""Sliding windows and logit soft-capping for the Triton attention kernels (radixserve.kernels).

Hugging Face's semantics: with a window ``W``, a query at position ``p`` sees the keys at
positions ``p - W + 1 .. p``; with a cap ``c``, the scaled scores ``s`` become ``c * tanh(s / c)``
before the mask and the softmax.  The kernels take both as runtime values behind constexpr
switches (``WINDOW``, ``SOFTCAP``), so a plain layer compiles to the kernel it always was.
"""
from __future__ import annotations

import triton
import triton.language as tl

from radixserve.kernels._utils import _dot, _online_softmax_step, _paged_kv_tile


def mod_args(sliding_window: int | None, logit_cap: float | None) -> tuple[int, float, bool, bool]:
    """``(window, logit_cap, WINDOW, SOFTCAP)``: the kernels' arguments for a layer's window
    (>= 1) and cap (> 0), None for none."""
    assert sliding_window is None or sliding_window >= 1, sliding_window
    assert logit_cap is None or logit_cap > 0, logit_cap
    return int(sliding_window or 0), float(logit_cap or 0.0), sliding_window is not None, logit_cap is not None


@triton.jit
def _softcap(qk, cap):
    """``cap * tanh(qk / cap)`` in fp32, tanh as ``(1 - e) / (1 + e)`` with ``e = exp(-2|x|)``."""
    x = qk / cap
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return cap * tl.where(x < 0.0, -t, t)


@triton.jit
def _attend_paged_mod(q, q_pos, m_i, l_i, acc, Row, lo, hi, limit, KBuf, VBuf, kvh, offs_d, mask_d,
                      stride_kbt, stride_kbh, stride_vbt, stride_vbh, sm_scale, window, logit_cap,
                      BLOCK_N: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
                      WINDOW: tl.constexpr, SOFTCAP: tl.constexpr):
    """``_utils._attend_paged`` with a layer's window (the query rows at positions ``q_pos [M]``
    see keys ``> q_pos - window``) and soft-cap."""
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        mask_n = offs_n < limit
        k, v = _paged_kv_tile(Row, offs_n, mask_n, KBuf, VBuf, kvh, offs_d, mask_d,
                              stride_kbt, stride_kbh, stride_vbt, stride_vbh, q.dtype)
        qk = _dot(q, k, UPCAST, IEEE) * sm_scale
        if SOFTCAP:
            qk = _softcap(qk, logit_cap)
        visible = mask_n[None, :]
        if WINDOW:
            visible = visible & (offs_n[None, :] > q_pos[:, None] - window)
        qk = tl.where(visible, qk, float("-inf"))
        m_i, l_i, acc = _online_softmax_step(qk, v, m_i, l_i, acc, UPCAST, IEEE)
    return m_i, l_i, acc
