"""How the host tier stores a token's K or V: exactly (the pool's dtype) or quantized.

``int8`` and ``fp8_e4m3`` keep one fp32 scale per token and KV head (the head's
largest magnitude over its ``head_dim`` values maps to the format's largest value), so a host
tier of the same bytes holds about twice the tokens of a bf16 pool (four times an fp32 one:
``head_dim + 4`` bytes a head against ``2 * head_dim`` or ``4 * head_dim``).  A load dequantizes
into the pool's dtype; the pool itself stays exact.
"""
from __future__ import annotations

from typing import Optional

import torch

# (fp8_e5m2, with 2 mantissa bits, agreed under the 97% bar on SmolLM2's bf16 pool: not offered)
QUANTIZED = {"int8": (torch.int8, 127.0), "fp8_e4m3": (torch.float8_e4m3fn, 448.0)}


class HostRows:
    """``slots`` rows of ``[heads, dim]`` in the ``kind`` form ("auto": ``dtype`` itself).

    Contract: ``put(idx, rows)`` stores ``rows [n, heads, dim]`` (any float dtype) at host slots
    ``idx``; ``get(idx)`` returns them in ``dtype`` (dequantized).  CPU tensors (pinned when
    ``pin``)."""

    def __init__(self, slots: int, heads: int, dim: int, dtype: torch.dtype, kind: str = "auto",
                 pin: bool = False) -> None:
        self.dtype, self.kind = dtype, kind
        self.code, self.qmax = QUANTIZED.get(kind, (dtype, 0.0))
        # fp8 codes live as uint8 (torch's CPU index ops do not take fp8 dtypes): same bytes, viewed
        store = torch.uint8 if self.code.is_floating_point and self.code.itemsize == 1 else self.code
        self.data = torch.zeros((slots, heads, dim), dtype=store, pin_memory=pin)
        self.scale: Optional[torch.Tensor] = (torch.zeros((slots, heads), dtype=torch.float32, pin_memory=pin)
                                              if kind in QUANTIZED else None)

    @staticmethod
    def slot_bytes(heads: int, dim: int, dtype: torch.dtype, kind: str = "auto") -> int:
        """Bytes one token's rows take in this form."""
        if kind in QUANTIZED:
            return heads * (dim + 4)
        return heads * dim * torch.tensor([], dtype=dtype).element_size()

    def put(self, idx: torch.Tensor, rows: torch.Tensor) -> None:
        if self.scale is None:
            self.data.index_copy_(0, idx, rows.to(self.dtype))
            return
        x = rows.float()
        scale = x.abs().amax(-1, keepdim=True).clamp_(min=1e-12) / self.qmax
        q = x / scale
        q = q.round_().clamp_(-self.qmax, self.qmax).to(torch.int8) if self.kind == "int8" else \
            q.to(self.code).view(torch.uint8)
        self.data.index_copy_(0, idx, q)
        self.scale.index_copy_(0, idx, scale.squeeze(-1))

    def get(self, idx: torch.Tensor) -> torch.Tensor:
        rows = self.data.index_select(0, idx)
        if self.scale is None:
            return rows
        if rows.dtype == torch.uint8:
            rows = rows.view(self.code)
        return (rows.float() * self.scale.index_select(0, idx).unsqueeze(-1)).to(self.dtype)
