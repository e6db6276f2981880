"""Attention with the Triton kernels of ``radixserve.kernels`` (CUDA; CPU under
``TRITON_INTERPRET=1``, which is how the tests run it).

The kernels live in the repository's top-level ``kernels/`` folder, installed as
``radixserve.kernels`` by ``[tool.setuptools.package-dir]`` in pyproject.toml (never
importable as a bare ``kernels``).

Per step, ``init_forward_metadata`` computes what every layer shares: the longest extend
length (grid size) in EXTEND mode; in DECODE mode the number of KV splits of each request
and the split-KV scratch buffers (allocated on the first layer, when the number of query
heads is known, and reused by the other layers).  Per layer, ``forward`` scatters the new
K/V into the pool with the kv_store kernel, then runs the extend or the decode kernel.

Sliding windows and logit soft-capping (``LayerAttention``) are the kernels' own
``sliding_window`` / ``logit_cap`` arguments, per layer.  In DECODE mode a window's layers cut
their last ``W`` positions into splits, so their split counts come from ``min(seq_len, W)``
(computed once per step and window).

A quantized pool (``kv_pool.quant``: packed rows of codes and a scale per token and head,
``mem_cache/kv_quant.py``) is passed to the kernels as ``kv_quant``: the store packs the rows, the
attention kernels dequantize them on load (the extend kernel then reads the new tokens from the
pool too).  q, k, v and the output are in the model's dtype, ``kv_pool.dtype``.
``caller_stores_kv`` stays None: no caller writes K/V into the pool itself.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from radixserve.attention.base import AttentionBackend, ForwardBatch, ForwardMode


@dataclass
class TritonMetadata:
    mode: ForwardMode
    max_extend_len: int = 0  # EXTEND: grid size along the query blocks
    num_kv_splits: Optional[torch.Tensor] = None  # DECODE: int32 [B]
    window_splits: dict[int, torch.Tensor] = field(default_factory=dict)  # DECODE: the same by sliding window
    attn_logits: Optional[torch.Tensor] = None  # DECODE: fp32 [B, H, max_kv_splits, D]
    attn_lse: Optional[torch.Tensor] = None  # DECODE: fp32 [B, H, max_kv_splits]


class TritonBackend(AttentionBackend):
    """``max_kv_splits``: most KV chunks of one decode request; a request of ``L`` tokens
    gets ``clamp(cdiv(L, min_tokens_per_split), 1, max_kv_splits)`` splits.  Block sizes
    default to the kernels' GPU defaults; tests pass small ones."""

    supported_features = frozenset({"sliding_window", "logit_softcap", "sliding_pool"})

    def __init__(
        self,
        kv_pool,
        max_kv_splits: int = 8,
        min_tokens_per_split: int = 256,
        extend_block_m: Optional[int] = None,
        extend_block_n: Optional[int] = None,
        decode_block_n: Optional[int] = None,
        decode_block_h: int = 16,
    ) -> None:
        super().__init__(kv_pool)
        # Imported here so that importing radixserve.attention never requires triton.
        from radixserve import kernels

        self._k = kernels
        self.max_kv_splits = int(max_kv_splits)
        self.min_tokens_per_split = int(min_tokens_per_split)
        self.extend_block_m = extend_block_m
        self.extend_block_n = extend_block_n
        self.decode_block_n = decode_block_n
        self.decode_block_h = decode_block_h

    @property
    def name(self) -> str:
        return "triton"

    def _splits(self, lens: torch.Tensor) -> torch.Tensor:
        splits = (lens + self.min_tokens_per_split - 1) // self.min_tokens_per_split
        return splits.clamp(1, self.max_kv_splits).to(torch.int32)

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        if batch.mode == ForwardMode.DECODE:
            meta = TritonMetadata(batch.mode, num_kv_splits=self._splits(batch.seq_lens))
            for w in () if self.plain else {la.sliding_window for la in self.layer_attention} - {None}:
                meta.window_splits[w] = self._splits(batch.seq_lens.clamp(max=w))
            batch.attn_metadata = meta
            return
        if batch.extend_seq_lens_cpu:
            max_ext = max(batch.extend_seq_lens_cpu)
        else:
            max_ext = int(batch.extend_seq_lens.max().item()) if batch.batch_size else 0
        batch.attn_metadata = TritonMetadata(batch.mode, max_extend_len=int(max_ext))

    def store_kv(self, layer_id: int, batch: ForwardBatch, k: torch.Tensor, v: torch.Tensor) -> None:
        pool = self.kv_pool
        self._k.store_kv(k, v, pool.k_buffer[layer_id], pool.v_buffer[layer_id], batch.layer_slots(pool, layer_id)[0],
                         kv_quant=pool.quant)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, scaling: float,
               batch: ForwardBatch) -> torch.Tensor:
        k_buf = self.kv_pool.k_buffer[layer_id]
        v_buf = self.kv_pool.v_buffer[layer_id]
        la = self.layer_attention[layer_id]
        table = batch.layer_slots(self.kv_pool, layer_id)[1]
        meta: TritonMetadata = batch.attn_metadata
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        if batch.mode == ForwardMode.DECODE:
            bsz, num_heads, head_dim = q.shape
            if (
                meta.attn_logits is None
                or meta.attn_logits.shape[1] != num_heads
                or meta.attn_logits.device != q.device
            ):
                meta.attn_logits, meta.attn_lse = self._k.alloc_decode_buffers(
                    bsz, num_heads, head_dim, self.max_kv_splits, q.device
                )
            splits = meta.num_kv_splits if la.sliding_window is None else meta.window_splits[la.sliding_window]
            self._k.decode_attention_fwd(
                q, k_buf, v_buf, out,
                table, batch.req_pool_indices, batch.seq_lens,
                splits, self.max_kv_splits, scaling,
                attn_logits=meta.attn_logits, attn_lse=meta.attn_lse,
                block_n=self.decode_block_n, block_h=self.decode_block_h,
                sliding_window=la.sliding_window, logit_cap=la.logit_softcap, kv_quant=self.kv_pool.quant,
            )
            return out
        self._k.extend_attention_fwd(
            q, k, v, out, k_buf, v_buf,
            table, batch.req_pool_indices, batch.seq_lens,
            batch.extend_prefix_lens, batch.extend_seq_lens, batch.extend_start_loc,
            meta.max_extend_len, scaling,
            block_m=self.extend_block_m, block_n=self.extend_block_n,
            sliding_window=la.sliding_window, logit_cap=la.logit_softcap, kv_quant=self.kv_pool.quant,
        )
        return out
