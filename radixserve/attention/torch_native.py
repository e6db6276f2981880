"""Attention over the paged KV pool with plain torch ops (the CPU backend).

Per step, ``init_forward_metadata`` builds the index tensors and masks once for all
layers; per layer, ``forward`` gathers K/V with ``index_select`` and runs batched matmuls.
There is no Python loop over requests:

* Extend batches are cut into a few buckets of similar query length (each bucket's longest
  request at most twice its shortest), so one long chunk does not pad a hundred short
  extends to its length; each bucket is one batched computation.
* When two or more requests of a bucket share a cached prefix of at least
  ``CASCADE_MIN_PREFIX`` tokens, the shared part is gathered and scored once per group
  (cascade.py); otherwise one padded ``scaled_dot_product_attention`` covers the bucket.

On CPU the math runs in fp32 (bf16 SDPA is slow without AMX and less accurate).

Layers with a sliding window or a logit soft-cap (``LayerAttention``) never take the cascade
path: each bucket then also gets the padded gather and one mask per window the layers use
(built once per step; a window no shorter than the bucket's longest row is the causal mask),
and a soft-capped layer computes its scores explicitly (``c * tanh(s / c)``, then the mask and
the softmax) where the others run SDPA.  Plain layers keep their path unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F

from radixserve.attention import cascade
from radixserve.attention.base import AttentionBackend, ForwardBatch, ForwardMode, LayerAttention

CASCADE_MIN_PREFIX = 32


@dataclass
class _Bucket:
    size: int
    max_q: int
    q_index: Optional[torch.Tensor]  # int64 [n * Qmax]: packed row of each padded query (EXTEND)
    src: Optional[torch.Tensor]  # int64: padded rows that are real queries
    dest: Optional[torch.Tensor]  # int64: their packed rows
    kv_index: Optional[torch.Tensor] = None  # int64 [n * Lmax]: slot of every (request, position)
    swa_kv_index: Optional[torch.Tensor] = None  # the same in the sliding-window pool (a hybrid pool)
    max_len: int = 0
    # bool [n, 1, Qmax, Lmax] by sliding window (None: causal only), for the layers that gather
    masks: dict[Optional[int], torch.Tensor] = field(default_factory=dict)
    cascade: Optional[cascade.CascadeMeta] = None


def length_buckets(lengths: list[int]) -> list[list[int]]:
    """Request indices grouped so that within a bucket max length <= 2 x min length."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    buckets: list[list[int]] = []
    for i in order:
        if buckets and lengths[i] * 2 >= lengths[buckets[-1][0]]:
            buckets[-1].append(i)
        else:
            buckets.append([i])
    return buckets


class TorchNativeBackend(AttentionBackend):
    supported_features = frozenset({"sliding_window", "logit_softcap", "sliding_pool"})

    def __init__(self, kv_pool) -> None:
        super().__init__(kv_pool)
        self.compute_dtype = torch.float32 if kv_pool.device.type == "cpu" else kv_pool.dtype
        self.use_cascade = not kv_pool.quant  # (the cascade reads the buffers' rows as K/V)
        self._windows: frozenset[Optional[int]] = frozenset()  # the masks of the non-plain layers
        self._some_plain = True  # whether a layer may take the cascade path

    @property
    def name(self) -> str:
        return "torch_native"

    def set_layer_attention(self, layers: list[LayerAttention]) -> None:
        super().set_layer_attention(layers)
        # None: the causal mask alone, for soft-capped layers without a window
        self._windows = frozenset(la.sliding_window for la in self.layer_attention if la.features)
        self._some_plain = any(not la.features for la in self.layer_attention)

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        windows = self._windows
        if batch.mode == ForwardMode.DECODE:
            batch.attn_metadata = [self._bucket(batch, None, windows)]
            return
        groups = length_buckets(batch.extend_seq_lens_cpu)
        if len(groups) == 1:
            batch.attn_metadata = [self._bucket(batch, None, windows)]
            return
        dev = batch.input_ids.device
        batch.attn_metadata = [self._bucket(batch, torch.tensor(g, device=dev), windows) for g in groups]

    def _bucket(self, batch: ForwardBatch, idx: Optional[torch.Tensor], windows: frozenset[Optional[int]]) -> _Bucket:
        """The bucket of requests ``idx`` (None: all), with the masks of ``windows`` besides what
        the plain layers use (the cascade, or the causal mask)."""
        dev = batch.input_ids.device
        pick = (lambda t: t) if idx is None else (lambda t: t.index_select(0, idx))
        seq_lens = pick(batch.seq_lens)
        n = int(seq_lens.shape[0])
        max_len = int(seq_lens.max())
        rows = batch.req_to_token.index_select(0, pick(batch.req_pool_indices))[:, :max_len].long()
        if batch.mode == ForwardMode.DECODE:
            b = _Bucket(n, 1, None, None, None)
            q_pos = (seq_lens - 1).unsqueeze(1)
        else:
            ext, pre, start = pick(batch.extend_seq_lens), pick(batch.extend_prefix_lens), pick(batch.extend_start_loc)
            max_q = int(ext.max())
            qa = torch.arange(max_q, device=dev)
            q_valid = qa.unsqueeze(0) < ext.unsqueeze(1)
            packed = start.unsqueeze(1) + qa.unsqueeze(0)
            if batch.gapped_cpu:  # reused documents: the new tokens sit at their own positions
                at = batch.positions.index_select(0, torch.where(q_valid, packed, 0).reshape(-1)).view(n, max_q)
                q_pos = torch.where(q_valid, at, -1)
            else:
                q_pos = torch.where(q_valid, pre.unsqueeze(1) + qa.unsqueeze(0), -1)
            q_index = torch.where(q_valid, packed, torch.zeros_like(packed)).reshape(-1)
            src = torch.nonzero(q_valid.reshape(-1)).squeeze(1)
            b = _Bucket(n, max_q, q_index, src, q_index.index_select(0, src))
        if self.use_cascade and n > 1 and self._some_plain:
            b.cascade = cascade.build(rows, seq_lens, q_pos, CASCADE_MIN_PREFIX)
        needed = set(windows) | ({None} if b.cascade is None else set())
        if needed:
            ar = torch.arange(max_len, device=dev)
            valid = ar.unsqueeze(0) < seq_lens.unsqueeze(1)
            b.kv_index = torch.where(valid, rows, torch.zeros_like(rows)).reshape(-1)
            if batch.swa_req_to_token is not None:  # slots a window hides may be stale: masked out
                swa_rows = batch.swa_req_to_token.index_select(0, pick(batch.req_pool_indices))[:, :max_len].long()
                b.swa_kv_index = torch.where(valid, swa_rows, torch.zeros_like(swa_rows)).reshape(-1)
            mask = (ar.view(1, 1, max_len) <= q_pos.unsqueeze(2)) & valid.unsqueeze(1)
            mask[:, :, 0] |= q_pos < 0  # padded queries see slot 0 so softmax stays finite
            for w in needed:  # a window no shorter than the longest row hides nothing
                hides = w is not None and w < max_len
                b.masks[w] = (mask & (ar.view(1, 1, max_len) > q_pos.unsqueeze(2) - w) if hides else mask).unsqueeze(1)
            b.max_len = max_len
        return b

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, scaling: float,
               batch: ForwardBatch) -> torch.Tensor:
        buckets: list[_Bucket] = batch.attn_metadata
        la = self.layer_attention[layer_id]
        qc = q.to(self.compute_dtype)
        if len(buckets) == 1:
            return self._bucket_attend(buckets[0], qc, layer_id, scaling, la).to(q.dtype)
        out = torch.empty_like(qc)
        for b in buckets:
            out.index_copy_(0, b.dest, self._bucket_attend(b, qc, layer_id, scaling, la))
        return out.to(q.dtype)

    def _bucket_attend(self, b: _Bucket, qc: torch.Tensor, layer_id: int, scaling: float,
                       la: LayerAttention) -> torch.Tensor:
        """Attention of one bucket; returns rows for its real queries (packed order for a
        single bucket, ``b.dest`` order otherwise)."""
        pool = self.kv_pool
        h, d = qc.shape[1], qc.shape[2]
        cd = self.compute_dtype
        qp = qc.view(b.size, 1, h, d) if b.q_index is None else qc.index_select(0, b.q_index).view(b.size, b.max_q, h, d)
        k_buf, v_buf = pool.k_buffer[layer_id], pool.v_buffer[layer_id]
        if b.cascade is not None and not la.features:
            out = cascade.forward(b.cascade, qp, k_buf, v_buf, scaling)
        else:
            hkv = pool.num_kv_heads
            index = b.swa_kv_index if pool.is_sliding[layer_id] else b.kv_index
            keys, vals = pool.read_kv(layer_id, index)  # (a quantized pool's rows dequantized)
            keys = keys.to(cd).view(b.size, b.max_len, hkv, d).transpose(1, 2)
            vals = vals.to(cd).view(b.size, b.max_len, hkv, d).transpose(1, 2)
            mask = b.masks[la.sliding_window]
            if la.logit_softcap is not None:
                out = _softcapped(qp.transpose(1, 2), keys, vals, mask, scaling, la.logit_softcap).transpose(1, 2)
            else:
                out = F.scaled_dot_product_attention(qp.transpose(1, 2), keys, vals, attn_mask=mask, scale=scaling,
                                                     enable_gqa=hkv != h).transpose(1, 2)
        if b.src is None:
            return out.reshape(b.size, h, d)
        return out.reshape(b.size * b.max_q, h, d).index_select(0, b.src)


def _softcapped(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scaling: float,
                cap: float) -> torch.Tensor:
    """SDPA with soft-capped scores: q ``[n, H, Q, D]``, k/v ``[n, Hkv, L, D]``, mask ``[n, 1, Q, L]``;
    returns ``[n, H, Q, D]``.  The query heads of a KV head are grouped against its K/V."""
    n, h, qlen, d = q.shape
    hkv = k.shape[1]
    qg = q.reshape(n, hkv, h // hkv, qlen, d)
    scores = torch.matmul(qg, k.unsqueeze(2).transpose(-1, -2)).mul_(scaling)
    scores = torch.tanh(scores.div_(cap)).mul_(cap).masked_fill_(~mask.unsqueeze(1), float("-inf"))
    return torch.matmul(scores.softmax(-1), v.unsqueeze(2)).reshape(n, h, qlen, d)
