"""Attention over the paged KV pool with plain torch ops (the CPU backend).

Per step, ``init_forward_metadata`` builds the index tensors and masks once for all
layers; per layer, ``forward`` gathers K/V with ``index_select`` and runs batched matmuls.
No Python loop over requests.  When two or more requests share a cached prefix of at
least ``CASCADE_MIN_PREFIX`` tokens, the shared part is gathered and scored once per group
(see cascade.py); otherwise one padded ``scaled_dot_product_attention`` covers the batch.
On CPU the math runs in fp32 (bf16 SDPA is slow without AMX and less accurate).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from radixserve.attention import cascade
from radixserve.attention.base import AttentionBackend, ForwardBatch, ForwardMode

CASCADE_MIN_PREFIX = 32


@dataclass
class _Meta:
    batch: int
    max_q: int
    q_index: Optional[torch.Tensor]  # int64 [B * Qmax]: packed row of each padded query (EXTEND)
    out_index: Optional[torch.Tensor]  # int64 [T]: padded row of each packed query (EXTEND)
    kv_index: Optional[torch.Tensor] = None  # int64 [B * Lmax]: slot of every (request, position)
    max_len: int = 0
    mask: Optional[torch.Tensor] = None  # bool [B, 1, Qmax, Lmax]
    cascade: Optional[cascade.CascadeMeta] = None


class TorchNativeBackend(AttentionBackend):
    def __init__(self, kv_pool) -> None:
        super().__init__(kv_pool)
        self.compute_dtype = torch.float32 if kv_pool.device.type == "cpu" else kv_pool.dtype
        self.use_cascade = True

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        dev = batch.input_ids.device
        bsz = batch.batch_size
        max_len = max(batch.seq_lens_cpu)
        rows = batch.req_to_token.index_select(0, batch.req_pool_indices)[:, :max_len].long()
        if batch.mode == ForwardMode.DECODE:
            max_q, q_index, out_index = 1, None, None
            q_pos = (batch.seq_lens - 1).unsqueeze(1)
        else:
            max_q = max(batch.extend_seq_lens_cpu)
            qa = torch.arange(max_q, device=dev)
            q_valid = qa.unsqueeze(0) < batch.extend_seq_lens.unsqueeze(1)
            q_pos = torch.where(q_valid, batch.extend_prefix_lens.unsqueeze(1) + qa.unsqueeze(0), -1)
            packed = batch.extend_start_loc.unsqueeze(1) + qa.unsqueeze(0)
            q_index = torch.where(q_valid, packed, torch.zeros_like(packed)).reshape(-1)
            out_index = torch.nonzero(q_valid.reshape(-1)).squeeze(1)
        meta = _Meta(bsz, max_q, q_index, out_index)
        if self.use_cascade and bsz > 1:
            meta.cascade = cascade.build(rows, batch.seq_lens, q_pos, CASCADE_MIN_PREFIX)
        if meta.cascade is None:
            ar = torch.arange(max_len, device=dev)
            valid = ar.unsqueeze(0) < batch.seq_lens.unsqueeze(1)
            meta.kv_index = torch.where(valid, rows, torch.zeros_like(rows)).reshape(-1)
            mask = (ar.view(1, 1, max_len) <= q_pos.unsqueeze(2)) & valid.unsqueeze(1)
            mask[:, :, 0] |= q_pos < 0  # padded queries see slot 0 so softmax stays finite
            meta.mask, meta.max_len = mask.unsqueeze(1), max_len
        batch.attn_metadata = meta

    def forward(self, q, k, v, layer_id, scaling, batch):
        pool = self.kv_pool
        pool.set_kv(layer_id, batch.out_cache_loc, k, v)
        m: _Meta = batch.attn_metadata
        h, d = q.shape[1], q.shape[2]
        cd = self.compute_dtype
        qc = q.to(cd)
        qp = qc.view(m.batch, 1, h, d) if m.q_index is None else qc.index_select(0, m.q_index).view(m.batch, m.max_q, h, d)
        k_buf, v_buf = pool.k_buffer[layer_id], pool.v_buffer[layer_id]
        if m.cascade is not None:
            out = cascade.forward(m.cascade, qp, k_buf, v_buf, scaling)
        else:
            hkv = pool.num_kv_heads
            keys = k_buf.index_select(0, m.kv_index).to(cd).view(m.batch, m.max_len, hkv, d).transpose(1, 2)
            vals = v_buf.index_select(0, m.kv_index).to(cd).view(m.batch, m.max_len, hkv, d).transpose(1, 2)
            out = F.scaled_dot_product_attention(qp.transpose(1, 2), keys, vals, attn_mask=m.mask, scale=scaling,
                                                 enable_gqa=hkv != h).transpose(1, 2)
        if m.out_index is None:
            return out.reshape(m.batch, h, d).to(q.dtype)
        return out.reshape(m.batch * m.max_q, h, d).index_select(0, m.out_index).to(q.dtype)
