"""Extend (prefill-after-prefix) attention over a paged KV pool, page size 1.

Each request ``i`` of the batch has ``extend_prefix_lens[i]`` tokens already in the pool
and ``extend_seq_lens[i]`` new tokens.  New token ``j`` (absolute position
``prefix + j``) attends to the whole cached prefix (no mask) and to new tokens ``0..j``
(causal).  GQA: query head ``h`` reads kv head ``h // (H // Hkv)``.

Layout (all on one device):
  * ``q_extend``  ``[T, H, D]``; ``k_extend``/``v_extend`` ``[T, Hkv, D]``: the new tokens,
    packed, request ``i`` owning rows ``extend_start_loc[i] : + extend_seq_lens[i]``.
    Token/head strides are free, the last dim must be contiguous.
  * ``k_buffer``/``v_buffer`` ``[S, Hkv, D]``: one layer of the pool; the prefix of request
    ``i`` is at slots ``req_to_token[req_pool_indices[i], :extend_prefix_lens[i]]``.
  * ``req_to_token`` int32 ``[R, C]`` (row stride free, last dim contiguous).
  * ``req_pool_indices``, ``seq_lens``, ``extend_prefix_lens``, ``extend_seq_lens``,
    ``extend_start_loc``: int32/int64 ``[B]``.
  * dtypes: fp32, fp16 or bf16 (q and the pool may differ: K/V are cast to q's dtype);
    softmax and accumulation in fp32; ``out`` ``[T, H, D]`` (contiguous) in its own dtype.

Grid: (B, H, cdiv(max_extend_len, BLOCK_M)); blocks past a request's length do no work.

A layer's sliding window ``W`` (new token at position ``p`` sees positions ``p - W + 1 .. p``)
masks both stages per query row and starts each stage at the first key the block's first
row sees; a logit cap ``c`` maps the scaled scores to ``c * tanh(s / c)`` (``_attn_mods``).

A quantized pool (``kv_quant``: packed rows, ``_utils.KV_FORMATS``) is read through the
dequantizing tile loader ``_utils._paged_kv_tile_q``, the new tokens included: they must be in
the pool already (``k_extend``/``v_extend`` are not read), so that a token's K/V are the same
quantized values whether a step computes them or finds them cached.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixserve.kernels._attn_mods import _attend_paged_mod, _softcap, mod_args
from radixserve.kernels._utils import (_attend_paged, _dot, _online_softmax_step, _paged_kv_tile_q, dot_flags,
                                       kv_format, next_pow2, scale_view)


@triton.jit
def _attend_paged_q(q, q_pos, m_i, l_i, acc, Row, lo, hi, limit, KBuf, VBuf, KScl, VScl, kvh, offs_d, mask_d,
                    stride_kbt, stride_kbh, stride_vbt, stride_vbh, D, sm_scale, window, logit_cap,
                    BLOCK_N: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
                    WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, KV_FORMAT: tl.constexpr):
    """``_attn_mods._attend_paged_mod`` over packed rows, causal: the query rows at positions
    ``q_pos [M]`` see the positions ``[lo, hi)`` of the request that are ``< limit`` and ``<= q_pos``
    (and ``> q_pos - window`` under WINDOW)."""
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        mask_n = offs_n < limit
        k, v = _paged_kv_tile_q(Row, offs_n, mask_n, KBuf, VBuf, KScl, VScl, kvh, offs_d, mask_d,
                                stride_kbt, stride_kbh, stride_vbt, stride_vbh, D, q.dtype, KV_FORMAT)
        qk = _dot(q, k, UPCAST, IEEE) * sm_scale
        if SOFTCAP:
            qk = _softcap(qk, logit_cap)
        visible = mask_n[None, :] & (offs_n[None, :] <= q_pos[:, None])
        if WINDOW:
            visible = visible & (offs_n[None, :] > q_pos[:, None] - window)
        qk = tl.where(visible, qk, float("-inf"))
        m_i, l_i, acc = _online_softmax_step(qk, v, m_i, l_i, acc, UPCAST, IEEE)
    return m_i, l_i, acc


@triton.jit
def _extend_attn_kernel(
    Q, KExt, VExt, O, KBuf, VBuf, KScl, VScl, ReqToToken,
    ReqPoolIdx, PrefixLens, ExtLens, ExtStart,
    sm_scale, window, logit_cap,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    stride_kbt, stride_kbh, stride_vbt, stride_vbh, stride_rr,
    D,
    KV_GROUP: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr, IEEE: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
    KV_FORMAT: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    mb = tl.program_id(2)
    kvh = h // KV_GROUP

    ext_start = tl.load(ExtStart + b).to(tl.int64)
    ext_len = tl.load(ExtLens + b).to(tl.int32)
    prefix_len = tl.load(PrefixLens + b).to(tl.int32)
    req = tl.load(ReqPoolIdx + b).to(tl.int64)

    offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask_m = offs_m < ext_len
    mask_d = offs_d < D
    block_live = mb * BLOCK_M < ext_len
    dt = Q.dtype.element_ty

    q = tl.load(
        Q + (ext_start + offs_m)[:, None] * stride_qt + h * stride_qh + offs_d[None, :],
        mask=mask_m[:, None] & mask_d[None, :], other=0.0,
    )
    # Finite initial max: a fully masked tile then gives exp(-inf - m) = 0, never NaN.
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    if KV_FORMAT != 0:  # prefix and new tokens in one pass over the pool, causal by position
        first = 0
        if WINDOW:
            first = tl.maximum(prefix_len + mb * BLOCK_M - window + 1, 0)
        seq_end = tl.where(block_live, prefix_len + tl.minimum((mb + 1) * BLOCK_M, ext_len), 0)
        m_i, l_i, acc = _attend_paged_q(q, prefix_len + offs_m, m_i, l_i, acc, ReqToToken + req * stride_rr, first,
                                        seq_end, prefix_len + ext_len, KBuf, VBuf, KScl, VScl, kvh, offs_d, mask_d,
                                        stride_kbt, stride_kbh, stride_vbt, stride_vbh, D, sm_scale, window,
                                        logit_cap, BLOCK_N, UPCAST, IEEE, WINDOW, SOFTCAP, KV_FORMAT)
    else:
        # Stage 1: the cached prefix, read through req_to_token; no mask but the length (and the window).
        prefix_end = tl.where(block_live, prefix_len, 0)
        if WINDOW or SOFTCAP:
            first = 0
            if WINDOW:  # the first key the block's first row sees
                first = tl.maximum(prefix_len + mb * BLOCK_M - window + 1, 0)
            m_i, l_i, acc = _attend_paged_mod(q, prefix_len + offs_m, m_i, l_i, acc, ReqToToken + req * stride_rr,
                                              first, prefix_end, prefix_len, KBuf, VBuf, kvh, offs_d, mask_d,
                                              stride_kbt, stride_kbh, stride_vbt, stride_vbh, sm_scale, window,
                                              logit_cap, BLOCK_N, UPCAST, IEEE, WINDOW, SOFTCAP)
        else:
            m_i, l_i, acc = _attend_paged(q, m_i, l_i, acc, ReqToToken + req * stride_rr, 0, prefix_end,
                                          prefix_len, KBuf, VBuf, kvh, offs_d, mask_d, stride_kbt, stride_kbh,
                                          stride_vbt, stride_vbh, sm_scale, BLOCK_N, UPCAST, IEEE)

        # Stage 2: the new tokens themselves, causal; only up to the end of this query block.
        ext_end = tl.where(block_live, tl.minimum((mb + 1) * BLOCK_M, ext_len), 0)
        ext_first = 0
        if WINDOW:
            ext_first = tl.maximum(mb * BLOCK_M - window + 1, 0)
        for start_n in range(ext_first, ext_end, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            mask_n = offs_n < ext_len
            k = tl.load(
                KExt + (ext_start + offs_n)[None, :] * stride_kt + kvh * stride_kh + offs_d[:, None],
                mask=mask_n[None, :] & mask_d[:, None], other=0.0,
            ).to(dt)
            qk = _dot(q, k, UPCAST, IEEE) * sm_scale
            if SOFTCAP:
                qk = _softcap(qk, logit_cap)
            causal = mask_n[None, :] & (offs_m[:, None] >= offs_n[None, :])
            if WINDOW:
                causal = causal & (offs_n[None, :] > offs_m[:, None] - window)
            qk = tl.where(causal, qk, float("-inf"))
            v = tl.load(
                VExt + (ext_start + offs_n)[:, None] * stride_vt + kvh * stride_vh + offs_d[None, :],
                mask=mask_n[:, None] & mask_d[None, :], other=0.0,
            ).to(dt)
            m_i, l_i, acc = _online_softmax_step(qk, v, m_i, l_i, acc, UPCAST, IEEE)

    l_i = tl.where(l_i > 0.0, l_i, 1.0)
    out = acc / l_i[:, None]
    tl.store(
        O + (ext_start + offs_m)[:, None] * stride_ot + h * stride_oh + offs_d[None, :],
        out.to(O.dtype.element_ty), mask=mask_m[:, None] & mask_d[None, :],
    )


def default_extend_blocks(head_dim: int) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N) for the GPU: 64x64 up to head_dim 128, 32x32 above."""
    return (64, 64) if head_dim <= 128 else (32, 32)


def extend_attention_fwd(
    q_extend: torch.Tensor,
    k_extend: torch.Tensor,
    v_extend: torch.Tensor,
    out: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_prefix_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    max_extend_len: int,
    scaling: float,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    sliding_window: int | None = None,
    logit_cap: float | None = None,
    kv_quant: str | None = None,
) -> torch.Tensor:
    """Write the extend attention of every new token into ``out [T, H, D]`` and return it.

    ``max_extend_len`` (host int) must be >= every ``extend_seq_lens[i]``; ``seq_lens`` is
    accepted for interface symmetry (``seq_lens == prefix + extend`` is assumed).  Block
    sizes must be powers of two; ``tl.dot`` on a GPU needs ``block_m, block_n >= 16``.
    ``sliding_window`` (>= 1) and ``logit_cap`` (> 0): the layer's window and soft-cap (None: none).
    ``kv_quant`` (int8, fp8_e4m3, fp8_e5m2; None: an exact pool): the buffers hold packed rows,
    uint8 ``[S, Hkv, D + 4]``, and the new tokens' K/V are read from them (stored first).
    """
    del seq_lens
    num_tokens, num_heads, head_dim = q_extend.shape
    batch = int(req_pool_indices.shape[0])
    if num_tokens == 0 or batch == 0:
        return out
    num_kv_heads = k_buffer.shape[1]
    assert num_heads % num_kv_heads == 0, (num_heads, num_kv_heads)
    assert k_extend.shape == (num_tokens, num_kv_heads, head_dim) == v_extend.shape
    assert out.shape == q_extend.shape and out.stride(-1) == 1
    assert req_to_token.stride(-1) == 1 and k_buffer.stride(-1) == 1 and v_buffer.stride(-1) == 1
    fmt = kv_format(kv_quant, (k_buffer, v_buffer), head_dim)
    q_extend, k_extend, v_extend = (
        t if t.stride(-1) == 1 else t.contiguous() for t in (q_extend, k_extend, v_extend)
    )
    dm, dn = default_extend_blocks(head_dim)
    block_m = block_m or dm
    block_n = block_n or dn
    upcast, ieee = dot_flags(q_extend.dtype, _extend_attn_kernel)
    window, cap, has_window, has_cap = mod_args(sliding_window, logit_cap)
    grid = (batch, num_heads, triton.cdiv(max(int(max_extend_len), 1), block_m))
    _extend_attn_kernel[grid](
        q_extend, k_extend, v_extend, out, k_buffer, v_buffer, scale_view(k_buffer, fmt), scale_view(v_buffer, fmt),
        req_to_token,
        req_pool_indices, extend_prefix_lens, extend_seq_lens, extend_start_loc,
        float(scaling), window, cap,
        q_extend.stride(0), q_extend.stride(1), k_extend.stride(0), k_extend.stride(1),
        v_extend.stride(0), v_extend.stride(1), out.stride(0), out.stride(1),
        k_buffer.stride(0), k_buffer.stride(1), v_buffer.stride(0), v_buffer.stride(1),
        req_to_token.stride(0),
        head_dim,
        KV_GROUP=num_heads // num_kv_heads,
        BLOCK_D=next_pow2(head_dim), BLOCK_M=block_m, BLOCK_N=block_n,
        UPCAST=upcast, IEEE=ieee, WINDOW=has_window, SOFTCAP=has_cap, KV_FORMAT=fmt,
        num_warps=num_warps or (4 if head_dim <= 64 else 8),
        num_stages=1,
    )
    return out
