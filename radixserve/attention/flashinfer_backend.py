"""Attention with FlashInfer's paged-KV wrappers (CUDA only; optional extra ``gpu``).

``flashinfer`` is imported lazily in ``__init__`` so that importing radixserve never
requires it.  The pool is viewed as FlashInfer's NHD paged cache with page size 1:
``k_buffer[l]`` ``[S, Hkv, D]`` -> ``[S, 1, Hkv, D]`` (pages = slots, no copy), passed
as the tuple ``(k_cache, v_cache)``.  Each request's ``req_to_token`` row becomes a CSR
page table: ``kv_indptr [B+1]`` (cumsum of seq_lens), ``kv_indices [sum(seq_lens)]`` (the
slots, in position order) and ``kv_last_page_len [B]`` (all ones).

EXTEND uses ``BatchPrefillWithPagedKVCacheWrapper`` with ``causal=True`` over the whole
context (prefix + new tokens, stored in the pool first); FlashInfer aligns the causal
mask to the end of the KV, which is exactly "new token ``j`` sees positions
``0..prefix+j``".  DECODE uses ``BatchDecodeWithPagedKVCacheWrapper``.

``plan()`` needs the number of query heads, the softmax scale and the dtypes, which the
interface only reveals in ``forward``; so ``init_forward_metadata`` builds the index
tensors and the first ``forward`` of a step plans (re-planning only if those change,
e.g. never across layers of one model).  FlashInfer kernels support fp16/bf16 only.

Sliding windows and logit soft-capping (``LayerAttention``) go to ``plan``: ``window_left =
W - 1`` (FlashInfer's window counts the keys left of the query, HF's ``W`` counts the query's
own) and ``logits_soft_cap = c`` (applied to the scaled scores, as HF does).  A plan holds one
of each, so every distinct (window, cap) of the model gets its own wrappers, planned once per
step on the first layer that uses them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from radixserve.attention.base import AttentionBackend, ForwardBatch, ForwardMode, LayerAttention

WORKSPACE_BYTES = 128 * 1024 * 1024


def build_kv_indices(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    total: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(kv_indptr int32 [B+1], kv_indices int32 [total])`` for page size 1, without a
    Python loop over requests (``total`` = sum(seq_lens), known on the host)."""
    dev = seq_lens.device
    bsz = int(seq_lens.shape[0])
    indptr = torch.zeros(bsz + 1, dtype=torch.int32, device=dev)
    indptr[1:] = torch.cumsum(seq_lens, 0).to(torch.int32)
    rows = req_pool_indices.long().repeat_interleave(seq_lens, output_size=total)
    starts = indptr[:-1].long().repeat_interleave(seq_lens, output_size=total)
    pos = torch.arange(total, device=dev) - starts
    indices = req_to_token[rows, pos].to(torch.int32)
    return indptr, indices


@dataclass
class FlashInferMetadata:
    mode: ForwardMode
    qo_indptr: Optional[torch.Tensor]  # int32 [B+1] (EXTEND)
    kv_indptr: torch.Tensor  # int32 [B+1]
    kv_indices: torch.Tensor  # int32 [sum(seq_lens)]
    kv_last_page_len: torch.Tensor  # int32 [B], ones
    # by the wrapper's (window, cap): (num_heads, head_dim, scaling, q dtype, kv dtype) last planned
    plan_keys: dict[tuple, Any] = field(default_factory=dict)


def plan_mods(la: LayerAttention) -> dict[str, Any]:
    """FlashInfer's ``plan`` arguments for a layer's window and cap (none for a plain layer)."""
    mods: dict[str, Any] = {}
    if la.sliding_window is not None:
        mods["window_left"] = la.sliding_window - 1  # keys left of the query; HF's window counts the query too
    if la.logit_softcap is not None:
        mods["logits_soft_cap"] = float(la.logit_softcap)
    return mods


class FlashInferBackend(AttentionBackend):
    supported_features = frozenset({"sliding_window", "logit_softcap"})

    def __init__(self, kv_pool, workspace_bytes: int = WORKSPACE_BYTES) -> None:
        """Raises ValueError for a quantized pool (``kv_pool.quant``): FlashInfer's paged KV takes
        one scale per tensor, a quantized pool has one per token and head."""
        super().__init__(kv_pool)
        if kv_pool.quant:
            raise ValueError("attention_backend: the flashinfer backend does not read a quantized KV pool "
                             "(per-token scales); use triton")
        try:
            import flashinfer
        except ImportError as e:  # pragma: no cover - depends on the install
            raise ImportError(
                "attention_backend=flashinfer needs the optional 'flashinfer-python' package "
                "(pip install 'radixserve[gpu]'); use --attention-backend triton instead"
            ) from e
        if kv_pool.device.type != "cuda":
            raise ValueError("attention_backend=flashinfer needs the KV pool on a CUDA device")
        self._fi = flashinfer
        self.workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device=kv_pool.device)
        self._prefill_wrappers: dict[tuple, Any] = {}  # keyed by (window, cap)
        self._decode_wrappers: dict[tuple, Any] = {}  # keyed by (use_tensor_cores, window, cap)

    @property
    def name(self) -> str:
        return "flashinfer"

    def _prefill_wrapper(self, mods: tuple):
        w = self._prefill_wrappers.get(mods)
        if w is None:
            w = self._fi.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD")
            self._prefill_wrappers[mods] = w
        return w

    def _decode_wrapper(self, use_tensor_cores: bool, mods: tuple):
        w = self._decode_wrappers.get((use_tensor_cores, mods))
        if w is None:
            w = self._fi.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace, "NHD", use_tensor_cores=use_tensor_cores
            )
            self._decode_wrappers[(use_tensor_cores, mods)] = w
        return w

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        dev = batch.seq_lens.device
        bsz = batch.batch_size
        total = sum(batch.seq_lens_cpu) if batch.seq_lens_cpu else int(batch.seq_lens.sum().item())
        kv_indptr, kv_indices = build_kv_indices(
            batch.req_to_token, batch.req_pool_indices, batch.seq_lens, total
        )
        last = torch.ones(bsz, dtype=torch.int32, device=dev)
        qo_indptr = None
        if batch.mode == ForwardMode.EXTEND:
            qo_indptr = torch.zeros(bsz + 1, dtype=torch.int32, device=dev)
            qo_indptr[1:] = torch.cumsum(batch.extend_seq_lens, 0).to(torch.int32)
        batch.attn_metadata = FlashInferMetadata(batch.mode, qo_indptr, kv_indptr, kv_indices, last)

    def _plan(self, meta: FlashInferMetadata, q: torch.Tensor, scaling: float, la: LayerAttention) -> Any:
        """Plan the wrapper of this step's mode and ``la``'s window and cap once per step (``q`` in
        the pool's dtype)."""
        pool = self.kv_pool
        num_heads, head_dim = int(q.shape[1]), int(q.shape[2])
        use_tc = num_heads // pool.num_kv_heads >= 4
        key = (num_heads, head_dim, float(scaling), q.dtype, pool.dtype)
        mods_key = (la.sliding_window, la.logit_softcap)
        planned = meta.plan_keys.get(mods_key) == key
        if meta.mode == ForwardMode.DECODE:
            wrapper = self._decode_wrapper(use_tc, mods_key)
            if not planned:
                wrapper.plan(
                    meta.kv_indptr, meta.kv_indices, meta.kv_last_page_len,
                    num_heads, pool.num_kv_heads, head_dim, 1,
                    sm_scale=float(scaling), q_data_type=q.dtype, kv_data_type=pool.dtype, **plan_mods(la),
                )
        else:
            wrapper = self._prefill_wrapper(mods_key)
            if not planned:
                wrapper.plan(
                    meta.qo_indptr, meta.kv_indptr, meta.kv_indices, meta.kv_last_page_len,
                    num_heads, pool.num_kv_heads, head_dim, 1,
                    causal=True, sm_scale=float(scaling),
                    q_data_type=q.dtype, kv_data_type=pool.dtype, **plan_mods(la),
                )
        meta.plan_keys[mods_key] = key
        return wrapper

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, scaling: float,
               batch: ForwardBatch) -> torch.Tensor:
        pool = self.kv_pool
        meta: FlashInferMetadata = batch.attn_metadata
        q_in = q if q.dtype == pool.dtype else q.to(pool.dtype)
        wrapper = self._plan(meta, q_in, scaling, self.layer_attention[layer_id])
        num_slots, hkv, d = pool.k_buffer[layer_id].shape
        kv_cache = (
            pool.k_buffer[layer_id].view(num_slots, 1, hkv, d),
            pool.v_buffer[layer_id].view(num_slots, 1, hkv, d),
        )
        out = wrapper.run(q_in.contiguous(), kv_cache)
        return out.to(q.dtype)
