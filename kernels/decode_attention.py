"""Split-KV decode attention over a paged KV pool, page size 1, grouped for GQA.

One query token per request attends to the request's whole context
``req_to_token[req_pool_indices[i], :seq_lens[i]]`` (its own new token included: store
K/V first).  The context of request ``i`` is cut into ``num_kv_splits[i]`` (<=
``max_kv_splits``) contiguous chunks of ``cdiv(seq_len, num_kv_splits[i])`` tokens.

Stage 1, grid (B, Hkv * cdiv(G, BLOCK_H), max_kv_splits) with G = H // Hkv: one program
loads the query rows of up to BLOCK_H heads that share one kv head (so each K/V tile is
read once per kv head, the QK^T and PV products are ``tl.dot`` of a ``[BLOCK_H, D]``
tile) and writes, per head, the chunk's normalised partial output
``attn_logits[b, h, split, :]`` and its log-sum-exp ``attn_lse[b, h, split]``.
Stage 2, grid (B, H): merges the non-empty splits by their log-sum-exp.

A layer's sliding window ``W`` restricts the context to its last ``W`` positions (the one
query sits at the last), which the splits then cut; a logit cap ``c`` maps the scaled scores
to ``c * tanh(s / c)`` (``_attn_mods``).  A quantized pool (``kv_quant``: packed rows,
``_utils.KV_FORMATS``) is read through the dequantizing tile loader ``_utils._paged_kv_tile_q``.

Layout:
  * ``q`` ``[B, H, D]`` (token/head strides free, last dim contiguous), fp32/fp16/bf16.
  * ``k_buffer``/``v_buffer`` ``[S, Hkv, D]`` one pool layer (cast to q's dtype on load), or
    uint8 ``[S, Hkv, D + 4]`` packed rows (dequantized to q's dtype on load).
  * ``req_to_token`` int32 ``[R, C]``; ``req_pool_indices``, ``seq_lens`` int ``[B]``
    (seq_lens >= 1); ``num_kv_splits`` int32 ``[B]`` in ``[1, max_kv_splits]``.
  * ``attn_logits`` fp32 ``[B, H, max_kv_splits, D]``, ``attn_lse`` fp32
    ``[B, H, max_kv_splits]``: scratch, may be shared by all layers of a step.
  * ``out`` ``[B, H, D]`` (last dim contiguous) in its own dtype.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixserve.kernels._attn_mods import _attend_paged_mod, mod_args
from radixserve.kernels._utils import _attend_paged, dot_flags, kv_format, next_pow2, scale_view
from radixserve.kernels.extend_attention import _attend_paged_q


@triton.jit
def _split_range(seq_len, num_splits, split, window, WINDOW: tl.constexpr):
    """``(start, end, span, per_split)``: the positions ``[start, end)`` of one split of the
    context ``[seq_len - span, seq_len)`` (the last ``window`` positions under a window)."""
    kv_start = 0
    if WINDOW:
        kv_start = tl.maximum(seq_len - window, 0)
    span = seq_len - kv_start
    per_split = tl.cdiv(span, num_splits)
    start = kv_start + split * per_split
    end = tl.minimum(start + per_split, seq_len)
    return start, end, span, per_split


@triton.jit
def _decode_stage1_kernel(
    Q, KBuf, VBuf, KScl, VScl, ReqToToken, ReqPoolIdx, SeqLens, NumSplits, AttOut, AttLse,
    sm_scale, window, logit_cap,
    stride_qb, stride_qh, stride_kbt, stride_kbh, stride_vbt, stride_vbh, stride_rr,
    stride_ab, stride_ah, stride_as, stride_lb, stride_lh,
    D,
    KV_GROUP: tl.constexpr, HEAD_BLOCKS: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr, IEEE: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
    KV_FORMAT: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1) // HEAD_BLOCKS
    hb = tl.program_id(1) % HEAD_BLOCKS
    split = tl.program_id(2)

    offs_g = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_g < KV_GROUP
    heads = kvh * KV_GROUP + offs_g
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D

    seq_len = tl.load(SeqLens + b).to(tl.int32)
    num_splits = tl.load(NumSplits + b).to(tl.int32)
    req = tl.load(ReqPoolIdx + b).to(tl.int64)
    start, end, span, per_split = _split_range(seq_len, num_splits, split, window, WINDOW)
    end = tl.where(split < num_splits, end, start)  # splits past num_splits are empty

    q = tl.load(
        Q + b.to(tl.int64) * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
        mask=mask_h[:, None] & mask_d[None, :], other=0.0,
    )
    m_i = tl.full([BLOCK_H], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    if KV_FORMAT != 0:  # the one query sits at the last position; the window is the split range already
        q_pos = tl.zeros([BLOCK_H], dtype=tl.int32) + (seq_len - 1)
        m_i, l_i, acc = _attend_paged_q(q, q_pos, m_i, l_i, acc, ReqToToken + req * stride_rr, start, end, end,
                                        KBuf, VBuf, KScl, VScl, kvh, offs_d, mask_d, stride_kbt, stride_kbh,
                                        stride_vbt, stride_vbh, D, sm_scale, window, logit_cap, BLOCK_N, UPCAST,
                                        IEEE, False, SOFTCAP, KV_FORMAT)
    elif SOFTCAP:  # the window is the split range already: no mask per row
        m_i, l_i, acc = _attend_paged_mod(q, offs_g, m_i, l_i, acc, ReqToToken + req * stride_rr, start, end, end,
                                          KBuf, VBuf, kvh, offs_d, mask_d, stride_kbt, stride_kbh, stride_vbt,
                                          stride_vbh, sm_scale, window, logit_cap, BLOCK_N, UPCAST, IEEE, False, True)
    else:
        m_i, l_i, acc = _attend_paged(q, m_i, l_i, acc, ReqToToken + req * stride_rr, start, end, end, KBuf, VBuf,
                                      kvh, offs_d, mask_d, stride_kbt, stride_kbh, stride_vbt, stride_vbh, sm_scale,
                                      BLOCK_N, UPCAST, IEEE)

    live_h = mask_h & ((tl.zeros([BLOCK_H], dtype=tl.int32) + end) > start)
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    base = b.to(tl.int64) * stride_ab + heads[:, None] * stride_ah + split * stride_as
    tl.store(AttOut + base + offs_d[None, :], acc / l_safe[:, None],
             mask=live_h[:, None] & mask_d[None, :])
    tl.store(AttLse + b.to(tl.int64) * stride_lb + heads * stride_lh + split,
             m_i + tl.log(l_safe), mask=live_h)


@triton.jit
def _decode_stage2_kernel(
    AttOut, AttLse, O, SeqLens, NumSplits, window,
    stride_ab, stride_ah, stride_as, stride_lb, stride_lh, stride_ob, stride_oh,
    D,
    BLOCK_D: tl.constexpr, WINDOW: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    seq_len = tl.load(SeqLens + b).to(tl.int32)
    num_splits = tl.load(NumSplits + b).to(tl.int32)
    _, _, span, per_split = _split_range(seq_len, num_splits, 0, window, WINDOW)

    m = -1.0e30
    denom = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    base_l = AttLse + b.to(tl.int64) * stride_lb + h * stride_lh
    base_a = AttOut + b.to(tl.int64) * stride_ab + h * stride_ah
    for s in range(0, num_splits):
        live = s * per_split < span
        lse = tl.load(base_l + s, mask=live, other=float("-inf"))
        live_d = mask_d & ((tl.zeros([BLOCK_D], dtype=tl.int32) + s * per_split) < span)
        part = tl.load(base_a + s * stride_as + offs_d, mask=live_d, other=0.0)
        m_new = tl.maximum(m, lse)
        alpha = tl.exp(m - m_new)
        w = tl.exp(lse - m_new)
        acc = acc * alpha + w * part
        denom = denom * alpha + w
        m = m_new
    tl.store(O + b.to(tl.int64) * stride_ob + h * stride_oh + offs_d,
             (acc / denom).to(O.dtype.element_ty), mask=mask_d)


def alloc_decode_buffers(batch: int, num_heads: int, head_dim: int, max_kv_splits: int,
                         device) -> tuple[torch.Tensor, torch.Tensor]:
    """Scratch ``(attn_logits [B, H, S, D], attn_lse [B, H, S])``, both fp32."""
    logits = torch.empty((batch, num_heads, max_kv_splits, head_dim), dtype=torch.float32, device=device)
    lse = torch.empty((batch, num_heads, max_kv_splits), dtype=torch.float32, device=device)
    return logits, lse


def decode_attention_fwd(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    out: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    num_kv_splits: torch.Tensor,
    max_kv_splits: int,
    scaling: float,
    attn_logits: torch.Tensor | None = None,
    attn_lse: torch.Tensor | None = None,
    block_n: int | None = None,
    block_h: int = 16,
    sliding_window: int | None = None,
    logit_cap: float | None = None,
    kv_quant: str | None = None,
) -> torch.Tensor:
    """Write the decode attention of ``q [B, H, D]`` into ``out [B, H, D]`` and return it.

    ``num_kv_splits[i]`` must lie in ``[1, max_kv_splits]``; scratch buffers are allocated
    when not given.  ``block_n`` defaults to 64 (32 above head_dim 128, to stay within
    shared memory).  Block sizes are powers of two; ``tl.dot`` on a GPU needs
    ``block_h, block_n >= 16`` (block_h is a tile size: smaller groups are masked).
    ``sliding_window`` (>= 1) and ``logit_cap`` (> 0): the layer's window and soft-cap (None:
    none); under a window the splits cut the last ``sliding_window`` positions.  ``kv_quant``
    (int8, fp8_e4m3, fp8_e5m2; None: an exact pool): the buffers hold packed rows.
    """
    batch, num_heads, head_dim = q.shape
    if batch == 0:
        return out
    num_kv_heads = k_buffer.shape[1]
    assert num_heads % num_kv_heads == 0, (num_heads, num_kv_heads)
    assert out.shape == q.shape and out.stride(-1) == 1
    assert req_to_token.stride(-1) == 1 and k_buffer.stride(-1) == 1 and v_buffer.stride(-1) == 1
    fmt = kv_format(kv_quant, (k_buffer, v_buffer), head_dim)
    if q.stride(-1) != 1:
        q = q.contiguous()
    if attn_logits is None or attn_lse is None:
        attn_logits, attn_lse = alloc_decode_buffers(batch, num_heads, head_dim, max_kv_splits, q.device)
    assert attn_logits.shape[0] >= batch and attn_logits.shape[1:] == (num_heads, max_kv_splits, head_dim)
    assert attn_lse.shape[0] >= batch and attn_lse.shape[1:] == (num_heads, max_kv_splits)
    assert attn_logits.stride(-1) == 1 and attn_lse.stride(-1) == 1
    block_n = block_n or (64 if head_dim <= 128 else 32)
    group = num_heads // num_kv_heads
    head_blocks = triton.cdiv(group, block_h)
    block_d = next_pow2(head_dim)
    upcast, ieee = dot_flags(q.dtype, _decode_stage1_kernel)
    window, cap, has_window, has_cap = mod_args(sliding_window, logit_cap)
    _decode_stage1_kernel[(batch, num_kv_heads * head_blocks, max_kv_splits)](
        q, k_buffer, v_buffer, scale_view(k_buffer, fmt), scale_view(v_buffer, fmt),
        req_to_token, req_pool_indices, seq_lens, num_kv_splits,
        attn_logits, attn_lse,
        float(scaling), window, cap,
        q.stride(0), q.stride(1), k_buffer.stride(0), k_buffer.stride(1),
        v_buffer.stride(0), v_buffer.stride(1), req_to_token.stride(0),
        attn_logits.stride(0), attn_logits.stride(1), attn_logits.stride(2),
        attn_lse.stride(0), attn_lse.stride(1),
        head_dim,
        KV_GROUP=group, HEAD_BLOCKS=head_blocks,
        BLOCK_D=block_d, BLOCK_H=block_h, BLOCK_N=block_n,
        UPCAST=upcast, IEEE=ieee, WINDOW=has_window, SOFTCAP=has_cap, KV_FORMAT=fmt,
        num_warps=4, num_stages=2,
    )
    _decode_stage2_kernel[(batch, num_heads)](
        attn_logits, attn_lse, out, seq_lens, num_kv_splits, window,
        attn_logits.stride(0), attn_logits.stride(1), attn_logits.stride(2),
        attn_lse.stride(0), attn_lse.stride(1), out.stride(0), out.stride(1),
        head_dim,
        BLOCK_D=block_d, WINDOW=has_window,
        num_warps=4 if block_d >= 128 else 2,
    )
    return out
