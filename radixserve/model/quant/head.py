"""An int8 LM head for the few logit rows of a decode step.

The LM head is the largest single weight of a small model (SmolLM2-135M: 49152 x 576, 28M of
its 135M parameters) and it runs at every step: in bf16 it took 36% of a batch-1 decode step
on the development machine.  Per-output-channel int8 (the decoder's ``int8`` format) cost
SmolLM2 about two points of teacher-forced argmax agreement with fp32 (96.7% with int4
decoder layers); one scale per 32 inputs of each channel cost none measurable (98.3%), so
the head uses groups of 32.  Kernel: the native ``blocked_linear`` (``model/quant/blocked.py``: 8-bit
codes ``q + 128``, activations rounded to int8 per group of 32, VNNI dot products) where it
takes the shape, else the native ``int8_linear`` (int16 activations); torch has no grouped
int8 kernel, and without the native library the head stays dense.  Measured on the
development machine (AMX Xeon, 2 threads, SmolLM2's head): 0.57 ms a call at M = 1 and 4,
against 0.61 and 1.56 ms for ``int8_linear``.

With float32 activations (``model.act_dtype``) the head is replaced only where the grid holds
the weight bit for bit (a Q8_0 GGUF's embedding): ``blocked_linear_exact`` then computes in
float32, as the dense head does, from a quarter of its bytes.

Contract: ``Int8HeadLinear(weight)(x)`` takes ``x [M, K]`` (fp32 or bf16) and returns the
logits ``[M, N]`` in ``x``'s dtype, equal to ``F.linear(x, dequantized weight)`` up to the
kernel's rounding (see ``kernels/cpu/int8_linear.cpp``).  ``quantize_lm_head`` attaches one to
a ``LlamaForCausalLM``, which uses it for calls of at most ``lm_head_max_m`` rows.
"""
from __future__ import annotations

import torch
from torch import nn

from radixserve.kernels import cpu_native
from radixserve.model.quant import blocked

GROUP = 32
HEAD_METHODS = ("int8", "int4")  # weight-only decoder formats whose models get the int8 head


def quantize_int8_grouped(w: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8 [N, K], scale fp32 [N, K / group]) with ``w ~ q * scale`` per group (symmetric)."""
    n, k = w.shape
    g = w.float().reshape(n, k // group, group)
    scale = g.abs().amax(-1, keepdim=True).clamp(min=1e-12) / 127
    q = torch.round(g / scale).clamp(-127, 127).to(torch.int8).reshape(n, k)
    return q, scale.reshape(n, k // group).contiguous()


def dequantize_int8_grouped(q: torch.Tensor, scale: torch.Tensor, group: int = GROUP) -> torch.Tensor:
    n, k = q.shape
    return (q.float().reshape(n, k // group, group) * scale[..., None]).reshape(n, k)


class Int8HeadLinear(nn.Module):
    def __init__(self, weight: torch.Tensor, exact: bool = False) -> None:
        """``exact``: float32 activations on ``blocked_linear_exact`` (the records must exist)."""
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.q, self.scale = quantize_int8_grouped(weight.detach())
        self.blocked = blocked.available(self.out_features, self.in_features)
        self.exact = exact and self.blocked
        if self.blocked:  # q becomes the kernel's records (codes and scales)
            self.q, self.scale = blocked.pack_blocked(self.q.to(torch.int32) + 128, self.scale, -128 * self.scale, 8), None

    def extra_repr(self) -> str:
        kernel = "blocked_linear_exact" if self.exact else "blocked_linear" if self.blocked else "int8_linear"
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 groups of {GROUP}, {kernel}"

    def dequantized(self) -> torch.Tensor:
        """The fp32 weight the kernel multiplies by."""
        if not self.blocked:
            return dequantize_int8_grouped(self.q, self.scale)
        u, d, m = blocked.unpack_blocked(self.q, 8)
        n, k = u.shape
        return (u.float().reshape(n, -1, GROUP) * d[..., None] + m[..., None]).reshape(n, k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.exact:
            return torch.ops.radixserve_cpu.blocked_linear_exact(x.contiguous(), self.q, 8)
        if self.blocked:
            return torch.ops.radixserve_cpu.blocked_linear(x.contiguous(), self.q, 8, None)
        return torch.ops.radixserve_cpu.int8_linear(x.contiguous(), self.q, self.scale)


def quantize_lm_head(model: nn.Module, method: str) -> bool:
    """Give ``model`` (a ``LlamaForCausalLM`` on the CPU) an ``Int8HeadLinear`` when ``method``
    is a weight-only format and the native kernels load; the dense weight stays for calls of
    more than ``model.lm_head_max_m`` rows.  True when one was made."""
    w = model.lm_head_weight()
    if method not in HEAD_METHODS or w.device.type != "cpu" or w.shape[1] % GROUP or not cpu_native.load():
        return False
    if getattr(model, "act_dtype", None) == torch.float32:
        # float32 activations keep float32 arithmetic: only a head whose int8 grid holds the
        # weight bit for bit (a Q8_0 GGUF's) is replaced, by the exact kernel
        n, k = w.shape
        if not blocked.exact_available(n, k):
            return False
        head = Int8HeadLinear(w, exact=True)
        if not blocked.holds_exactly(head.q, 8, w):
            return False
        model.lm_head_quant = head
        return True
    model.lm_head_quant = Int8HeadLinear(w)
    return True
