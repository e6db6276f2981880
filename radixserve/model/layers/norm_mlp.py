"""Shared building blocks: RMSNorm and the gated MLP (rotary embeddings: ``rotary.py``).

The modules hold the weights; the elementwise math goes through an ops class
(``fused_ops.TorchOps`` or ``NativeCpuOps``) chosen once when the model is built.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from radixserve.model.cpu.fused_ops import TorchOps
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


ACTIVATIONS = ("silu", "gelu_pytorch_tanh", "gelu_tanh")


def activation(config: Any) -> str:
    """The MLP activation a config names (``hidden_act`` / Gemma's ``hidden_activation``);
    raises ValueError for one that is not built."""
    act = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", "silu")
    if act not in ACTIVATIONS:
        raise ValueError(f"model: activation {act!r} is not supported ({', '.join(ACTIVATIONS)})")
    return act


def act_mul(ops: type[TorchOps], act: str):
    """The ops' gated activation for ``act`` (an ``activation()`` name): ``fn(gate_up) -> act(gate) * up``."""
    return ops.silu_mul if act == "silu" else ops.gelu_tanh_mul


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)) with gate and up fused into one matmul; ``act`` is SiLU
    (SwiGLU) or tanh-approximated GELU (GeGLU).  Under tensor parallelism ``intermediate`` is
    this rank's share and ``tp`` sums the ranks' outputs."""

    def __init__(self, hidden: int, intermediate: int, bias: bool = False, ops: type[TorchOps] = TorchOps,
                 tp: Any = None, act: str = "silu") -> None:
        super().__init__()
        self.intermediate = intermediate
        self.ops = ops
        self.tp = tp or NoTP()
        self.act = act
        self.act_mul = act_mul(ops, act)
        self.gate_up_proj = nn.Linear(hidden, 2 * intermediate, bias=bias)
        self.down_proj = nn.Linear(intermediate, hidden, bias=bias)

    lora: Any = None  # a LoRAHolder when adapters are served (worker/lora/), with ``lora_layer``
    lora_layer = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lora = self.lora.step if self.lora is not None else None
        if lora is None:
            return self.tp.all_reduce(self.down_proj(self.act_mul(self.gate_up_proj(x))))
        h = self.act_mul(lora.add(self.lora_layer, "gate_up", x, self.gate_up_proj(x)))
        return self.tp.all_reduce(lora.add(self.lora_layer, "down", h, self.down_proj(h)))
