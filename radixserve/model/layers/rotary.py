"""Rotary position embeddings: the frequencies every config variant asks for, one cos/sin table.

``rope_parameters(config, layer_type)`` normalizes old (``rope_theta`` + ``rope_scaling``) and
new (``rope_parameters``, possibly one dict per layer type, as Gemma 3 has) transformers configs.
The inverse frequencies of the scaled variants (``linear``, ``llama3``, ``yarn``, ``longrope``,
``dynamic``) come from transformers' own ``ROPE_INIT_FUNCTIONS``, so they are exactly the
reference's, with the attention factor (yarn, longrope) folded into the cos/sin table as the
reference folds it.  Two variants depend on the sequence length in the reference:

* ``dynamic`` (NTK) equals the unscaled rope up to ``max_position_embeddings``; serving a longer
  context is refused with a message naming it.
* ``longrope`` uses the short factors while a sequence fits ``original_max_position_embeddings``
  and recomputes everything with the long factors beyond; a cache cannot do that, so positions
  past the original length take the long factors (vLLM's choice): exact up to that length.

``partial_rotary_factor`` rotates the first part of each head only (Phi-3/4, some Qwen): the
table is narrower than the head, and every rope op rotates the dims the table covers.
"""
from __future__ import annotations

import copy
from typing import Any, Optional

import torch
from torch import nn

from radixserve.model.cpu.fused_ops import TorchOps


def rope_parameters(config: Any, layer_type: Optional[str] = None) -> dict[str, Any]:
    """One dict with ``rope_theta`` and ``rope_type`` (and the variant's keys) for ``layer_type``."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    if layer_type is not None and isinstance(params.get(layer_type), dict):
        params = dict(params[layer_type])
    elif params and all(isinstance(v, dict) for v in params.values()):
        params = dict(next(iter(params.values())))
    scaling = getattr(config, "rope_scaling", None) or {}
    for key, value in scaling.items():
        if not isinstance(value, dict):
            params.setdefault(key, value)
    if "type" in params and "rope_type" not in params:
        params["rope_type"] = params["type"]
    params.setdefault("rope_type", "default")
    params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    if params["rope_type"] == "su":  # the old name of longrope
        params["rope_type"] = "longrope"
    return params


def rotary_dim(config: Any, head_dim: int) -> int:
    return int(head_dim * float(getattr(config, "partial_rotary_factor", None) or 1.0))


def _frequencies(config: Any, head_dim: int, params: dict[str, Any], layer_type: Optional[str],
                 seq_len: Optional[int] = None) -> tuple[torch.Tensor, float]:
    kind = params["rope_type"]
    if kind == "default":
        dim = rotary_dim(config, head_dim)
        base = float(params["rope_theta"])
        return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)), 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if kind not in ROPE_INIT_FUNCTIONS:
        raise ValueError(f"model: rope_type {kind!r} is not supported "
                         f"(default, {', '.join(sorted(ROPE_INIT_FUNCTIONS))})")
    # the reference reads the config's own rope dict; give it the normalized one for this layer type
    cfg = copy.copy(config)
    cfg.rope_parameters = params
    if getattr(cfg, "head_dim", None) is None:
        cfg.head_dim = head_dim
    inv, scale = ROPE_INIT_FUNCTIONS[kind](cfg, torch.device("cpu"), seq_len=seq_len)
    return inv.float(), float(scale)


class RotaryEmbedding(nn.Module):
    """Non-interleaved (rotate-half) rotary embedding with a precomputed fp32 cos/sin table
    ``[max_positions, rotary_dim]`` (the attention factor folded in)."""

    def __init__(self, head_dim: int, max_positions: int, params: dict[str, Any], ops: type[TorchOps] = TorchOps,
                 config: Any = None, layer_type: Optional[str] = None) -> None:
        super().__init__()
        self.ops = ops
        self.head_dim = head_dim
        kind = params["rope_type"]
        orig = int(params.get("original_max_position_embeddings")
                   or getattr(config, "original_max_position_embeddings", None)
                   or getattr(config, "max_position_embeddings", max_positions))
        if kind == "dynamic" and max_positions - 1 > orig:
            raise ValueError(f"model: rope_type 'dynamic' (NTK) changes with the sequence length beyond "
                             f"{orig} positions; serve a context_length of at most {orig}")
        inv, scale = _frequencies(config, head_dim, params, layer_type)
        self.rotary_dim = 2 * inv.shape[0]
        t = torch.arange(max_positions, dtype=torch.float32)
        freqs = torch.outer(t, inv)
        if kind == "longrope" and max_positions > orig:
            inv_long, _ = _frequencies(config, head_dim, params, layer_type, seq_len=orig + 1)
            freqs[orig:] = torch.outer(t[orig:], inv_long)
        emb = torch.cat([freqs, freqs], dim=-1)
        # a key rotated at p moves to p + s by a rotation of s * inv_freq (worker/doc_kv.py), unless
        # the frequencies depend on the position (longrope's long factors past the original length)
        self.inv_freq = inv
        self.shift_invariant = not (kind == "longrope" and max_positions > orig)
        self.fused = ops.fused_rope_store  # rope_store_kv is one native pass
        self.register_buffer("cos", emb.cos() * scale, persistent=False)
        self.register_buffer("sin", emb.sin() * scale, persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> None:
        """Rotate q ``[T, H, D]`` and k ``[T, Hkv, D]`` in place (fp32 math, input dtype)."""
        self.ops.rope_(q, k, positions, self.cos, self.sin)

    def rope_store_kv(self, qkv: torch.Tensor, positions: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
                      loc: torch.Tensor, q_out: torch.Tensor) -> torch.Tensor:
        """Rotate the fused projection's q into ``q_out`` and its k into ``k_buf[loc]``; copy its v
        into ``v_buf[loc]`` (``fused_ops`` ``rope_store_kv``); returns ``q_out``.  Only when ``fused``."""
        return self.ops.rope_store_kv(qkv, positions, self.cos, self.sin, k_buf, v_buf, loc, q_out)


def build_rotary(config: Any, head_dim: int, max_positions: int, ops: type[TorchOps],
                 layer_type: Optional[str] = None) -> RotaryEmbedding:
    """The rotary embedding of ``config`` (for ``layer_type`` where rope differs per layer type)."""
    return RotaryEmbedding(head_dim, max_positions, rope_parameters(config, layer_type), ops, config, layer_type)
