"""Multi-head latent attention (DeepSeek-V2) over the paged KV pool, run as multi-query attention.

The pool stores, per token and layer, one vector of ``kv_lora_rank + qk_rope_head_dim``: the
compressed KV latent ``c`` (``kv_a_layernorm`` of ``kv_a_proj_with_mqa``'s first outputs) and
the rotated key part shared by all heads, ``k_pe``.  It is both K and V (``KVPool(shared_kv)``).
``kv_b_proj`` holds per head ``W_UK [nope, r]`` and ``W_UV [v, r]``, so that

    q_nope . (W_UK c) = (W_UK^T q_nope) . c        sum_t p_t (W_UV c_t) = W_UV (sum_t p_t c_t):

each head's query is ``[W_UK^T q_nope ; rope(q_pe)]`` against ``K = V = [c ; rope(k_pe)]``,
and the first ``kv_lora_rank`` dims of its output, through ``W_UV``, are its value output
("weight absorption", as SGLang and vLLM run MLA).  Every attention backend computes this
unchanged.  ``absorb()`` cuts ``W_UK``/``W_UV`` out of ``kv_b_proj`` once after loading and
drops ``kv_b_proj``, so quantization and packing never see it.

Rotary: the reference rotates interleaved pairs ``(x0, x1), (x2, x3), ...`` (complex form).
The rows that make ``q_pe`` and ``k_pe`` are reordered at load (``deinterleave_rope_rows``:
evens first) so that the usual rotate-half rotary gives the same scores: a dot product does
not change when both of its sides are permuted alike, and only dot products read ``q_pe``/``k_pe``.
Scale: ``qk_head_dim ** -0.5``, times yarn's ``mscale(factor, mscale_all_dim) ** 2`` where the
config sets it (transformers' ``yarn_apply_mscale``).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from radixserve.attention.base import AttentionBackend, ForwardBatch
from radixserve.model.cpu.fused_ops import TorchOps
from radixserve.model.layers.norm_mlp import RMSNorm
from radixserve.model.layers.rotary import RotaryEmbedding, rope_parameters

LORA_NORM_EPS = 1e-6  # q_a_layernorm / kv_a_layernorm: the reference's default, not rms_norm_eps


def deinterleave_rope_rows(t: torch.Tensor, head_width: int, rope_dim: int) -> torch.Tensor:
    """``t``'s rows (dim 0) in blocks of ``head_width`` whose last ``rope_dim`` rows are a head's
    rotary part, those reordered ``x0, x2, ..., x1, x3, ...`` (a weight or a bias)."""
    blocks = t.reshape(-1, head_width, *t.shape[1:])
    perm = torch.cat([torch.arange(0, rope_dim, 2), torch.arange(1, rope_dim, 2)]) + head_width - rope_dim
    order = torch.cat([torch.arange(head_width - rope_dim), perm]).to(t.device)
    return blocks.index_select(1, order).reshape(t.shape)


def mla_scaling(config: Any) -> float:
    """The softmax scale of the reference's attention."""
    from transformers.modeling_rope_utils import yarn_apply_mscale

    head_dim = config.qk_nope_head_dim + config.qk_rope_head_dim
    return float(yarn_apply_mscale(rope_parameters(config), head_dim ** -0.5))


class MLAttention(nn.Module):
    """DeepSeek-V2's attention with ``q_lora_rank`` set (``q_a_proj``, ``q_a_layernorm``,
    ``q_b_proj``) or None (one query projection, loaded as ``wq``: the weight loader fuses any
    ``q_proj`` with k/v).  ``head_dim``/``num_kv_heads``: what the KV pool stores per token."""

    def __init__(self, config: Any, layer_id: int, rotary: RotaryEmbedding, ops: type[TorchOps] = TorchOps) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.num_heads = config.num_attention_heads
        self.nope, self.rope, self.v_dim = config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim
        self.rank = config.kv_lora_rank
        self.num_kv_heads, self.head_dim = 1, self.rank + self.rope
        self.scaling = mla_scaling(config)
        self.rotary = rotary
        hidden, heads, bias = config.hidden_size, self.num_heads, bool(getattr(config, "attention_bias", False))
        q_rank = config.q_lora_rank
        if q_rank is None:
            self.q_a_proj = None
            self.wq = nn.Linear(hidden, heads * (self.nope + self.rope), bias=False)
        else:
            self.q_a_proj = nn.Linear(hidden, q_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(q_rank, LORA_NORM_EPS, ops)
            self.q_b_proj = nn.Linear(q_rank, heads * (self.nope + self.rope), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden, self.rank + self.rope, bias=bias)
        self.kv_a_layernorm = RMSNorm(self.rank, LORA_NORM_EPS, ops)
        self.kv_b_proj = nn.Linear(self.rank, heads * (self.nope + self.v_dim), bias=False)
        self.o_proj = nn.Linear(heads * self.v_dim, hidden, bias=bias)
        self.register_buffer("w_uk", None, persistent=False)  # [H, nope, r]
        self.register_buffer("w_uv", None, persistent=False)  # [H, r, v]

    def absorb(self) -> None:
        """Cut ``W_UK``/``W_UV`` out of the loaded ``kv_b_proj`` and drop it (once, after loading)."""
        w = self.kv_b_proj.weight.detach().view(self.num_heads, self.nope + self.v_dim, self.rank)
        self.w_uk = w[:, : self.nope].contiguous()
        self.w_uv = w[:, self.nope:].transpose(1, 2).contiguous()
        del self.kv_b_proj

    def forward(self, x: torch.Tensor, batch: ForwardBatch, backend: AttentionBackend) -> torch.Tensor:
        t, h = x.shape[0], self.num_heads
        q = self.wq(x) if self.q_a_proj is None else self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q_nope, q_pe = q.reshape(t, h, self.nope + self.rope).split([self.nope, self.rope], dim=-1)
        latent, k_pe = self.kv_a_proj_with_mqa(x).split([self.rank, self.rope], dim=-1)
        q_pe, k_pe = q_pe.contiguous(), k_pe.contiguous().view(t, 1, self.rope)
        self.rotary.forward(batch.positions, q_pe, k_pe)
        kv = torch.cat([self.kv_a_layernorm(latent), k_pe.view(t, self.rope)], dim=-1).unsqueeze(1)
        q_latent = torch.bmm(q_nope.transpose(0, 1), self.w_uk)  # [H, T, r]
        q = torch.cat([q_latent.transpose(0, 1), q_pe], dim=-1)  # [T, H, r + rope]
        out = backend.forward(q, kv, kv, self.layer_id, self.scaling, batch)
        o = torch.bmm(out[..., : self.rank].transpose(0, 1), self.w_uv)  # [H, T, v]
        return self.o_proj(o.transpose(0, 1).reshape(t, h * self.v_dim))
