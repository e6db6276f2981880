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
    (the cached prefix fully, the new tokens causally), or, in a layer with a sliding window
    ``W`` (``LayerAttention``), to positions ``p - W + 1 .. p`` only.
"""
from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Optional

import torch

from radixserve.mem_cache.kv_pool import KVPool


@dataclass(frozen=True)
class LayerAttention:
    """What one layer's attention computes beyond ``softmax(q k^T * scaling) v`` over the
    causal context (Gemma 2/3, Mistral, Qwen with sliding layers).  The default is plain
    causal attention; ``features`` names what a backend must support for this layer."""

    sliding_window: Optional[int] = None  # a token at position p sees keys at positions > p - W
    logit_softcap: Optional[float] = None  # scores -> cap * tanh(scores / cap), before the mask

    @property
    def features(self) -> frozenset[str]:
        return frozenset(name for name, on in (("sliding_window", self.sliding_window is not None),
                                               ("logit_softcap", self.logit_softcap is not None)) if on)


class NativeGroup(NamedTuple):
    """What the layers of one attention kind (``LayerAttention``) share in a step on the native
    CPU kernel: the slots their new K/V are stored at, the request->slot table and plan tensors
    of ``radixserve_cpu::paged_attention``, and its ``window`` and ``softcap`` (0: none)."""

    loc: torch.Tensor  # int64 [num_tokens]
    r2t: torch.Tensor  # int32 [max_requests, max_context_len]
    tasks: torch.Tensor
    entry_tok: torch.Tensor
    tok_ptr: torch.Tensor
    tok_entries: torch.Tensor
    window: int
    softcap: float


def needed_features(layers: list[LayerAttention]) -> frozenset[str]:
    """Every feature some layer of ``layers`` needs a backend to compute."""
    return frozenset().union(*(la.features for la in layers))


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
    # the sliding-window pool's slots of the new tokens and table (``KVPool.is_sliding`` layers)
    swa_out_cache_loc: Optional[torch.Tensor] = None
    swa_req_to_token: Optional[torch.Tensor] = None
    # per request: its new tokens are a subset of its window at non-contiguous ``positions``
    # (reused documents, ``worker/doc_kv.py``), each attending to the row's keys 0..its position;
    # empty: none is (every request's tokens are its last ``extend_seq_lens``)
    gapped_cpu: list[bool] = field(default_factory=list)

    def slots(self, sliding: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """(the new tokens' slots, the request->slot table): the sliding-window pool's when
        ``sliding``, else the full pool's."""
        if sliding:
            return self.swa_out_cache_loc, self.swa_req_to_token
        return self.out_cache_loc, self.req_to_token

    def layer_slots(self, pool: KVPool, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``slots`` of layer ``layer_id``'s buffers (a sliding layer of a hybrid pool: its own)."""
        return self.slots(pool.is_sliding[layer_id])

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
    # When nonzero (the CPU backend over a packed pool: ``kernels/cpu/kv_packed.h``'s kv_format),
    # a caller whose K/V are in the pool's ``dtype`` may instead pack them into the pool itself with
    # ``radixserve_cpu::store_kv_packed(k, v, loc, k_buf, v_buf, packed_store)`` and then ``attend``.
    packed_store: int = 0
    # The LayerAttention features this backend computes (a subclass lists what it implements).
    supported_features: frozenset[str] = frozenset()

    def __init__(self, kv_pool: KVPool) -> None:
        self.kv_pool = kv_pool
        self.layer_attention: list[LayerAttention] = [LayerAttention()] * kv_pool.num_layers
        self._plain = True  # read per step: computed once, by set_layer_attention

    def set_layer_attention(self, layers: list[LayerAttention]) -> None:
        """Declare each layer's attention (once, before the first step; the model's
        ``layer_attention()``).  Raises ValueError naming the feature this backend lacks."""
        missing = needed_features(layers) - self.supported_features
        if missing:
            raise ValueError(f"attention_backend: the {self.name} backend does not support "
                             f"{', '.join(sorted(missing))}, which this model needs")
        if len(layers) != self.kv_pool.num_layers:
            raise ValueError(f"attention_backend: {len(layers)} layers' attention for a pool of "
                             f"{self.kv_pool.num_layers} layers")
        self.layer_attention = list(layers)
        self._plain = not needed_features(self.layer_attention)

    @property
    def name(self) -> str:
        return type(self).__name__.removesuffix("Backend").lower()

    @property
    def plain(self) -> bool:
        """True when every layer is plain causal attention (no window, no soft-capping)."""
        return self._plain

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

    def native_layer_plans(self, batch: ForwardBatch, num_heads: int) -> Optional[tuple[list[NativeGroup], list[int]]]:
        """``(groups, layer_group)``: this step's distinct layer attentions as ``NativeGroup``s and
        each layer's index into them, when every layer's attention is one call into
        ``radixserve_cpu::paged_attention`` with its group's arguments (a caller may then make those
        calls itself, storing layer ``l``'s K/V at ``groups[layer_group[l]].loc``); None otherwise.
        ``layer_group`` is the same list object from step to step while the layers' attention is."""
        return None

    def store_kv(self, layer_id: int, batch: ForwardBatch, k: torch.Tensor, v: torch.Tensor) -> None:
        self.kv_pool.set_kv(layer_id, batch.layer_slots(self.kv_pool, layer_id)[0], k, v)

    @abstractmethod
    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, scaling: float,
               batch: ForwardBatch) -> torch.Tensor:
        """The attention output of this layer; the new tokens' K/V are in the pool already."""
