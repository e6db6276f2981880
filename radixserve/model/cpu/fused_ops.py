"""The elementwise ops of a decoder layer, behind one small interface.

``TorchOps`` composes torch ops (any device, the reference); ``NativeCpuOps`` calls the fused
C++ ops of ``kernels/cpu/fused_ops.cpp`` (one pass each, no temporaries), used on the CPU
when the native library builds.  Both compute in fp32 and round bf16 results at the same
points (after the residual add, after normalizing, after SiLU, after each product).

Contracts: ``add_rms_norm(x, residual, w, eps)`` returns ``(normed, residual + x)``, normed in
x's dtype and the sum in the residual's (fp32 under a bf16 x: a bf16 model keeps its residual
stream in fp32), and may overwrite both inputs (callers never reuse them); ``rope_(q, k, positions, cos, sin)``
rotates q and k in place (they may be strided views of the fused qkv output; a cos/sin table
narrower than the head rotates its first dims only: a partial rotary);
``rms_norm_heads_(qkv, q_w, k_w, H, Hkv, eps)`` RMS-normalizes each query and key head of the
fused projection in place (Qwen 3's q/k norms), rounding as ``rms_norm``;
``silu_mul(gate_up)`` returns ``silu(gate) * up`` for ``gate_up = [gate | up]``, ``gelu_tanh_mul``
the same with tanh-approximated GELU (GeGLU);
``rope_store_kv(qkv, positions, cos, sin, k_buf, v_buf, loc, q_out)`` takes the fused projection
``qkv [T, (H + 2 Hkv) D]`` and writes ``q_out [T, H, D] = rope(q)``, ``k_buf[loc] = rope(k)`` and
``v_buf[loc] = v`` (``k_buf``/``v_buf``: one layer of the KV pool, in qkv's dtype), returning
``q_out``; it equals ``rope_`` followed by ``index_copy_`` into the pool, bit for bit.
``fused_rope_store`` says whether the class has a one-pass ``rope_store_kv`` worth using in place
of the separate ops (TorchOps' is the reference composition).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from radixserve.kernels import cpu_native


class TorchOps:
    name = "torch"
    fused_rope_store = False

    @staticmethod
    def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float, dtype: torch.dtype | None = None) -> torch.Tensor:
        """``w * normalize(x)``, normalized in fp32 and rounded to ``dtype`` (default x's)."""
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return w * h.to(dtype or x.dtype)

    @classmethod
    def add_rms_norm(cls, x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, eps: float):
        residual = (residual + x).to(residual.dtype)
        return cls.rms_norm(residual, w, eps, x.dtype), residual

    @staticmethod
    def rope_(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
        c, s = cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)
        r = cos.shape[-1]  # < head_dim: a partial rotary of the first r dims
        for x in (q, k):
            part, half = x[..., :r], r // 2
            xf = part.float()
            rotated = torch.cat((-xf[..., half:], xf[..., :half]), dim=-1)
            part.copy_(xf * c + rotated * s)

    @classmethod
    def rms_norm_heads_(cls, qkv: torch.Tensor, q_w: torch.Tensor, k_w: torch.Tensor, heads: int, kv_heads: int,
                        eps: float) -> None:
        d = q_w.shape[0]
        for w, lo, n in ((q_w, 0, heads), (k_w, heads, kv_heads)):
            part = qkv[:, lo * d:(lo + n) * d]
            part.copy_(cls.rms_norm(part.reshape(-1, d), w, eps).view(part.shape))

    @staticmethod
    def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up

    @staticmethod
    def gelu_tanh_mul(gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.gelu(gate, approximate="tanh") * up

    @classmethod
    def rope_store_kv(cls, qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                      k_buf: torch.Tensor, v_buf: torch.Tensor, loc: torch.Tensor,
                      q_out: torch.Tensor) -> torch.Tensor:
        heads, dim = q_out.shape[1:]
        hkv = k_buf.shape[1]
        q, k, v = qkv.split([heads * dim, hkv * dim, hkv * dim], dim=-1)
        q, k = q.reshape(-1, heads, dim).clone(), k.reshape(-1, hkv, dim).clone()
        cls.rope_(q, k, positions, cos, sin)
        k_buf.index_copy_(0, loc, k)
        v_buf.index_copy_(0, loc, v.reshape(-1, hkv, dim))
        return q_out.copy_(q)


class NativeCpuOps(TorchOps):
    name = "native-cpu"
    fused_rope_store = True

    @staticmethod
    def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        return torch.ops.radixserve_cpu.rms_norm(x.contiguous(), w, eps)

    @staticmethod
    def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, eps: float):
        x = x.contiguous()
        torch.ops.radixserve_cpu.add_rms_norm(x, residual, w, eps)
        return x, residual

    @staticmethod
    def rope_(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
        torch.ops.radixserve_cpu.rope_(q, k, positions, cos, sin)

    @staticmethod
    def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
        return torch.ops.radixserve_cpu.silu_mul(gate_up.contiguous())

    @staticmethod
    def gelu_tanh_mul(gate_up: torch.Tensor) -> torch.Tensor:
        return torch.ops.radixserve_cpu.gelu_tanh_mul(gate_up.contiguous())

    @staticmethod
    def rms_norm_heads_(qkv: torch.Tensor, q_w: torch.Tensor, k_w: torch.Tensor, heads: int, kv_heads: int,
                        eps: float) -> None:
        torch.ops.radixserve_cpu.rms_norm_heads_(qkv, q_w, k_w, heads, kv_heads, eps)

    @staticmethod
    def rope_store_kv(qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                      k_buf: torch.Tensor, v_buf: torch.Tensor, loc: torch.Tensor,
                      q_out: torch.Tensor) -> torch.Tensor:
        torch.ops.radixserve_cpu.rope_store_kv(qkv, positions, cos, sin, k_buf, v_buf, loc, q_out)
        return q_out


def select_ops(device: torch.device, dtype: torch.dtype) -> type[TorchOps]:
    """The native ops on a CPU with fp32/bf16 weights when the library builds; else torch's."""
    if device.type == "cpu" and dtype in (torch.float32, torch.bfloat16) and cpu_native.load():
        return NativeCpuOps
    return TorchOps
