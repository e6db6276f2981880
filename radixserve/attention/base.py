"""The attention-backend interface and the per-step batch description it reads.

Layout contract (shared by every backend and by the Triton kernels):
  * KV pool: per layer, ``k_buffer[layer]`` and ``v_buffer[layer]`` of shape
    ``[num_slots, num_kv_heads, head_dim]``.  Slot 0 is a reserved padding slot that is
    never handed out by the allocator, so kernels may write padding there.
  * ``req_to_token``: int32 ``[max_requests, max_context_len]``; row ``r`` lists the KV
    slot of every token of the request in row ``r``, in position order.
  * Queries, keys and values of the new tokens are packed over the batch:
    ``q [num_tokens, num_heads, head_dim]``, ``k/v [num_tokens, num_kv_heads, head_dim]``,
    request ``i`` owning rows ``extend_start_loc[i] : extend_start_loc[i] + extend_seq_lens[i]``.
  * A new token at absolute position ``p`` attends to positions ``0..p`` of its request
    (the cached prefix fully, the new tokens causally).
"""
from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from radixserve.mem_cache.kv_pool import KVPool


class ForwardMode(enum.Enum):
    EXTEND = 1  # prefill of new tokens after a (possibly empty) cached prefix
    DECODE = 2  # exactly one new token per request


@dataclass
class ForwardBatch:
    """One model step.  All tensors live on the model's device.

    seq_lens[i] = extend_prefix_lens[i] + extend_seq_lens[i] (total tokens after the step).
    In DECODE mode extend_seq_lens is all ones.  ``*_cpu`` lists mirror the tensors for
    backends that need host-side sizes.
    """

    mode: ForwardMode
    input_ids: torch.Tensor  # int64 [num_tokens]
    positions: torch.Tensor  # int64 [num_tokens]
    out_cache_loc: torch.Tensor  # int64 [num_tokens]: KV slot of each new token
    req_pool_indices: torch.Tensor  # int64 [batch]
    seq_lens: torch.Tensor  # int64 [batch]
    extend_prefix_lens: torch.Tensor  # int64 [batch]
    extend_seq_lens: torch.Tensor  # int64 [batch]
    extend_start_loc: torch.Tensor  # int64 [batch]: exclusive cumsum of extend_seq_lens
    req_to_token: torch.Tensor  # int32 [max_requests, max_context_len]
    seq_lens_cpu: list[int] = field(default_factory=list)
    extend_prefix_lens_cpu: list[int] = field(default_factory=list)
    extend_seq_lens_cpu: list[int] = field(default_factory=list)
    attn_metadata: Any = None  # filled by AttentionBackend.init_forward_metadata

    @property
    def batch_size(self) -> int:
        return int(self.req_pool_indices.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])


class AttentionBackend(ABC):
    """Computes attention over the paged KV pool.

    Contract: ``init_forward_metadata`` is called once per step before the model runs and
    may precompute anything that is shared by all layers (index tensors, masks, planner
    state).  ``forward`` is called once per layer: it stores the new tokens' ``k``/``v``
    into the pool at ``batch.out_cache_loc`` (``store_kv``, which a backend may override with
    its own kernel) and then returns ``attend``: the attention output
    ``[num_tokens, num_heads, head_dim]`` in q's dtype.  No backend loops in Python over the
    requests of the batch.  Backends are built by ``attention.registry.create_attention_backend``.
    """

    # When set (to the pool's dtype), ``attend`` reads the new tokens' K/V from the pool only, never
    # from its ``k``/``v`` arguments: a caller whose K/V are in this dtype may write them into
    # ``kv_pool`` at ``batch.out_cache_loc`` itself (fused with rotary) and call ``attend`` with
    # ``k = v = None`` instead of ``forward``.
    caller_stores_kv: Optional[torch.dtype] = None

    def __init__(self, kv_pool: KVPool) -> None:
        self.kv_pool = kv_pool

    @abstractmethod
    def init_forward_metadata(self, batch: ForwardBatch) -> None: ...

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, scaling: float,
                batch: ForwardBatch) -> torch.Tensor:
        self.store_kv(layer_id, batch, k, v)
        return self.attend(q, k, v, layer_id, scaling, batch)

    def step_attention(self, batch: ForwardBatch, num_heads: int) -> Callable[[torch.Tensor, int, float], torch.Tensor]:
        """For a caller that writes K/V itself (``caller_stores_kv``): ``fn(q, layer_id, scaling)``,
        this step's ``attend`` for every layer, with per-step work done once.  ``q`` must be
        contiguous ``[num_tokens, num_heads, head_dim]`` in the pool's dtype.  The tensor ``fn``
        returns may be reused by its next call: consume it before the next layer's."""
        return lambda q, layer_id, scaling: self.attend(q, None, None, layer_id, scaling, batch)

    def native_plan(self, batch: ForwardBatch, num_heads: int) -> Optional[tuple[torch.Tensor, ...]]:
        """``(req_to_token, tasks, entry_tok, tok_ptr, tok_entries)``: the arguments of
        ``radixserve_cpu::paged_attention`` for this step, when every layer's attention is one call
        into that kernel (a caller may then make those calls itself); None otherwise."""
        return None

    def store_kv(self, layer_id: int, batch: ForwardBatch, k: torch.Tensor, v: torch.Tensor) -> None:
        self.kv_pool.set_kv(layer_id, batch.out_cache_loc, k, v)

    @abstractmethod
    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, scaling: float,
               batch: ForwardBatch) -> torch.Tensor:
        """The attention output of this layer; the new tokens' K/V are in the pool already."""
