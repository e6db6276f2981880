"""Attention over the paged KV pool with plain torch ops (the CPU backend).

Per step, ``init_forward_metadata`` builds one padded slot-index matrix ``[B, Lmax]`` and
one boolean mask for the whole batch; per layer, ``forward`` gathers K/V with a single
``index_select`` and runs one batched ``scaled_dot_product_attention``.  No Python loop
over requests.  On CPU the math runs in fp32 (bf16 SDPA is slow without AMX and less
accurate); on other devices in the pool's dtype.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from radixserve.attention.base import AttentionBackend, ForwardBatch, ForwardMode


@dataclass
class _Meta:
    kv_index: torch.Tensor  # int64 [B * Lmax]: slot of every (request, position), 0 = pad
    batch: int
    max_len: int
    mask: torch.Tensor  # bool [B, 1, Qmax, Lmax]
    q_index: torch.Tensor | None  # int64 [B * Qmax]: packed row of each padded query (EXTEND)
    out_index: torch.Tensor | None  # int64 [T]: padded row of each packed query (EXTEND)
    max_q: int


class TorchNativeBackend(AttentionBackend):
    def __init__(self, kv_pool) -> None:
        super().__init__(kv_pool)
        dev = kv_pool.device
        self.compute_dtype = torch.float32 if dev.type == "cpu" else kv_pool.dtype

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        dev = batch.input_ids.device
        bsz = batch.batch_size
        max_len = max(batch.seq_lens_cpu)
        seq_lens = batch.seq_lens
        ar = torch.arange(max_len, device=dev)
        valid = ar.unsqueeze(0) < seq_lens.unsqueeze(1)  # [B, Lmax]
        rows = batch.req_to_token.index_select(0, batch.req_pool_indices)[:, :max_len].long()
        kv_index = torch.where(valid, rows, torch.zeros_like(rows)).reshape(-1)
        if batch.mode == ForwardMode.DECODE:
            mask = valid.view(bsz, 1, 1, max_len)
            batch.attn_metadata = _Meta(kv_index, bsz, max_len, mask, None, None, 1)
            return
        max_q = max(batch.extend_seq_lens_cpu)
        qa = torch.arange(max_q, device=dev)
        q_valid = qa.unsqueeze(0) < batch.extend_seq_lens.unsqueeze(1)  # [B, Qmax]
        q_pos = batch.extend_prefix_lens.unsqueeze(1) + qa.unsqueeze(0)  # absolute position
        mask = (ar.view(1, 1, max_len) <= q_pos.unsqueeze(2)) & valid.unsqueeze(1)
        mask = mask & q_valid.unsqueeze(2)
        # Padded query rows attend to slot 0 only so softmax stays finite; they are dropped.
        mask[:, :, 0] |= ~q_valid
        packed = batch.extend_start_loc.unsqueeze(1) + qa.unsqueeze(0)
        q_index = torch.where(q_valid, packed, torch.zeros_like(packed)).reshape(-1)
        out_index = (torch.arange(bsz, device=dev) * max_q).repeat_interleave(
            batch.extend_seq_lens, output_size=batch.num_tokens
        ) + (torch.arange(batch.num_tokens, device=dev) - batch.extend_start_loc.repeat_interleave(
            batch.extend_seq_lens, output_size=batch.num_tokens))
        batch.attn_metadata = _Meta(kv_index, bsz, max_len, mask.unsqueeze(1), q_index, out_index, max_q)

    def forward(self, q, k, v, layer_id, scaling, batch):
        pool = self.kv_pool
        pool.set_kv(layer_id, batch.out_cache_loc, k, v)
        m: _Meta = batch.attn_metadata
        h, d = q.shape[1], q.shape[2]
        hkv = pool.num_kv_heads
        cd = self.compute_dtype
        keys = pool.k_buffer[layer_id].index_select(0, m.kv_index).view(m.batch, m.max_len, hkv, d)
        vals = pool.v_buffer[layer_id].index_select(0, m.kv_index).view(m.batch, m.max_len, hkv, d)
        keys = keys.to(cd).transpose(1, 2)
        vals = vals.to(cd).transpose(1, 2)
        if m.q_index is None:
            qp = q.to(cd).view(m.batch, h, 1, d)
        else:
            qp = q.to(cd).index_select(0, m.q_index).view(m.batch, m.max_q, h, d).transpose(1, 2)
        out = F.scaled_dot_product_attention(qp, keys, vals, attn_mask=m.mask, scale=scaling, enable_gqa=hkv != h)
        if m.out_index is None:
            return out.view(m.batch, h, d).to(q.dtype)
        out = out.transpose(1, 2).reshape(m.batch * m.max_q, h, d)
        return out.index_select(0, m.out_index).to(q.dtype)
