"""Llama building blocks: RMSNorm, rotary embeddings and the gated MLP.

The modules hold the weights; the elementwise math goes through an ops class
(``fused_ops.TorchOps`` or ``NativeCpuOps``) chosen once when the model is built.
"""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from radixserve.model.fused_ops import TorchOps
from radixserve.parallel.group import NoTP


class RMSNorm(nn.Module):
    """RMSNorm computed in fp32 and cast back, as in the reference implementation."""

    def __init__(self, dim: int, eps: float, ops: type[TorchOps] = TorchOps) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.ops = ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.rms_norm(x, self.weight, self.eps)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(norm(residual + x), residual + x)``; may overwrite ``x`` and ``residual``."""
        return self.ops.add_rms_norm(x, residual, self.weight, self.eps)

    def add_forward_fp32(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """``norm(residual + x)`` in fp32, not rounded to the model's dtype (for the few rows
        the LM head reads); ``x`` and ``residual`` are not changed."""
        r = residual.float() + x.float()
        return self.weight.float() * (r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + self.eps))


def rope_parameters(config: Any) -> dict[str, Any]:
    """Normalize the rope settings of old (rope_theta + rope_scaling) and new
    (rope_parameters) transformers configs into one dict with ``rope_theta`` and ``rope_type``."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    scaling = getattr(config, "rope_scaling", None) or {}
    for key, value in scaling.items():
        params.setdefault(key, value)
    if "type" in params and "rope_type" not in params:
        params["rope_type"] = params["type"]
    params.setdefault("rope_type", "default")
    params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    return params


def _inv_freq(head_dim: int, params: dict[str, Any]) -> torch.Tensor:
    base = float(params["rope_theta"])
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    kind = params["rope_type"]
    if kind == "default":
        return inv
    if kind == "linear":
        return inv / float(params["factor"])
    if kind == "llama3":
        factor = float(params["factor"])
        low, high = float(params["low_freq_factor"]), float(params["high_freq_factor"])
        old_ctx = float(params["original_max_position_embeddings"])
        low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(medium, smoothed, scaled)
    raise NotImplementedError(f"rope_type {kind!r} is not supported (default, linear, llama3)")


class RotaryEmbedding(nn.Module):
    """Non-interleaved (rotate-half) rotary embedding with a precomputed cos/sin table."""

    def __init__(self, head_dim: int, max_positions: int, params: dict[str, Any], ops: type[TorchOps] = TorchOps) -> None:
        super().__init__()
        self.ops = ops
        self.fused = ops.fused_rope_store  # rope_store_kv is one native pass
        inv = _inv_freq(head_dim, params)
        t = torch.arange(max_positions, dtype=torch.float32)
        freqs = torch.outer(t, inv)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> None:
        """Rotate q ``[T, H, D]`` and k ``[T, Hkv, D]`` in place (fp32 math, input dtype)."""
        self.ops.rope_(q, k, positions, self.cos, self.sin)

    def rope_store_kv(self, qkv: torch.Tensor, positions: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
                      loc: torch.Tensor, q_out: torch.Tensor) -> torch.Tensor:
        """Rotate the fused projection's q into ``q_out`` and its k into ``k_buf[loc]``; copy its v
        into ``v_buf[loc]`` (``fused_ops`` ``rope_store_kv``); returns ``q_out``."""
        return self.ops.rope_store_kv(qkv, positions, self.cos, self.sin, k_buf, v_buf, loc, q_out)


class GatedMLP(nn.Module):
    """down(silu(gate(x)) * up(x)) with gate and up fused into one matmul.  Under tensor
    parallelism ``intermediate`` is this rank's share and ``tp`` sums the ranks' outputs."""

    def __init__(self, hidden: int, intermediate: int, bias: bool = False, ops: type[TorchOps] = TorchOps,
                 tp: Any = None) -> None:
        super().__init__()
        self.intermediate = intermediate
        self.ops = ops
        self.tp = tp or NoTP()
        self.gate_up_proj = nn.Linear(hidden, 2 * intermediate, bias=bias)
        self.down_proj = nn.Linear(intermediate, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce(self.down_proj(self.ops.silu_mul(self.gate_up_proj(x))))
