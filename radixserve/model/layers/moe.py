"""The sparse mixture-of-experts block shared by Mixtral, Qwen2-MoE and Qwen3-MoE.

``SparseMoE(x)``: a router (``gate``) scores the experts per token; softmax, top-k and the
family's flags (``Routing``) give each token ``k`` experts and weights; ``Experts`` runs them
grouped; Qwen2-MoE adds an always-on ``shared_expert`` scaled by ``sigmoid(shared_expert_gate(x))``.

The arithmetic is transformers 5.25's default experts path (``grouped_mm``, what its models run):
the softmax in fp32; Mixtral keeps the routing weights in fp32 (so each weighted expert output is
fp32), Qwen rounds them to the model's dtype first; a token's ``k`` weighted outputs are summed in
top-k order by one ``sum`` (fp32 accumulation) and rounded to the model's dtype once.  fp32 results
equal the reference bit for bit (its ``eager`` path, which adds each expert's output in turn in the
model's dtype, differs by rounding only).

Grouped experts: the ``T * k`` (token, expert) slots are sorted by expert; each expert with tokens
runs its rows as ONE gate_up GEMM, the activation and ONE down GEMM (a Python loop over the experts
that have tokens, never over tokens; on the CPU this is what ``F.grouped_mm`` does too, bit for
bit), then the rows are weighted and scattered back to their slots (``index_copy_``).  Expert
weights are stacked 3-D tensors, ``gate_up_proj [E, 2I, H]`` (gate rows first) and
``down_proj [E, H, I]``: transformers' in-memory layout, what a grouped GPU kernel would read.  On
CUDA the same torch code runs (one cuBLAS GEMM per expert, one host sync for the per-expert
counts); a fused Triton MoE kernel (or ``F.grouped_mm`` on CUDA) is out of scope here.

The router and the shared-expert gate are ``DenseProjection``s, not ``nn.Linear``: quantization
(``model/quant/linear.py``) and oneDNN packing replace ``nn.Linear`` layers only, so routing stays
exact and the experts stay dense under ``quantization`` int8/int4 (attention and the shared and
dense MLPs are quantized as in any model).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from radixserve.model.cpu.fused_ops import TorchOps
from radixserve.model.layers.norm_mlp import GatedMLP, act_mul


@dataclass(frozen=True)
class Routing:
    """How router logits pick experts: softmax (fp32), ``top_k``, renormalised over the top-k
    when ``norm_topk_prob``; ``fp32_weights``: keep the weights in fp32 (Mixtral) rather than
    rounding them to the logits' dtype (Qwen)."""

    top_k: int
    norm_topk_prob: bool
    fp32_weights: bool


def route(logits: torch.Tensor, routing: Routing) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k], expert ids [T, k]) for router logits [T, E]."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, experts = torch.topk(probs, routing.top_k, dim=-1)
    if routing.norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return (weights if routing.fp32_weights else weights.to(logits.dtype)), experts


class DenseProjection(nn.Module):
    """``x @ weight.T`` without bias; deliberately not an ``nn.Linear`` (never quantized or packed)."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class Experts(nn.Module):
    """``E`` gated MLPs held as stacked weights; ``forward(x, weights, experts)`` returns
    ``sum_j weights[t, j] * expert[experts[t, j]](x[t])`` per token, in ``x``'s dtype."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int,
                 act_mul: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.act_mul = act_mul
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, intermediate))

    def forward(self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        k = experts.shape[1]
        flat = experts.reshape(-1)
        order = torch.argsort(flat, stable=True)  # the T * k slots by expert (by token within one)
        rows = x.index_select(0, order // k)
        out = torch.empty_like(rows)
        start = 0
        for e, n in enumerate(torch.bincount(flat, minlength=self.num_experts).tolist()):
            if n:
                h = self.act_mul(F.linear(rows[start:start + n], self.gate_up_proj[e]))
                out[start:start + n] = F.linear(h, self.down_proj[e])
                start += n
        weighted = out * weights.reshape(-1, 1).index_select(0, order)  # fp32 under fp32 weights
        slots = torch.empty_like(weighted).index_copy_(0, order, weighted)  # back to (token, j) order
        return slots.view(x.shape[0], k, x.shape[1]).sum(dim=1).to(x.dtype)


class SparseMoE(nn.Module):
    """The MoE MLP of one layer: ``gate`` (router), ``experts`` and, with ``shared_intermediate``,
    Qwen2-MoE's ``shared_expert`` and ``shared_expert_gate``.  ``x [T, hidden] -> [T, hidden]``."""

    def __init__(self, hidden: int, num_experts: int, intermediate: int, routing: Routing,
                 ops: type[TorchOps] = TorchOps, act: str = "silu", shared_intermediate: Optional[int] = None) -> None:
        super().__init__()
        self.routing = routing
        self.gate = DenseProjection(hidden, num_experts)
        self.experts = Experts(num_experts, hidden, intermediate, act_mul(ops, act))
        self.shared_expert = self.shared_expert_gate = None
        if shared_intermediate:
            self.shared_expert = GatedMLP(hidden, shared_intermediate, ops=ops, act=act)
            self.shared_expert_gate = DenseProjection(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, experts = route(self.gate(x), self.routing)
        out = self.experts(x, weights, experts)
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out
