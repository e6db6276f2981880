"""How the host tier stores a token's K or V: exactly (the pool's rows as they are) or quantized.

``int8`` and ``fp8_e4m3`` store packed rows (``mem_cache/kv_quant.py``: one-byte codes and an fp32
scale per token and KV head), so a host tier of the same bytes holds about twice the tokens of a
bf16 pool (four times an fp32 one: ``head_dim + 4`` bytes a head against ``2 * head_dim`` or
``4 * head_dim``).  A load dequantizes into the pool's dtype; the pool itself stays exact.  A
quantized pool (``--kv-cache-dtype``) is held in the exact form: its packed rows are copied as they
are, with their scales.
"""
from __future__ import annotations

import torch

from radixserve.mem_cache import kv_quant

# (fp8_e5m2, with 2 mantissa bits, agreed under the 97% bar on SmolLM2's bf16 pool: not offered)
QUANTIZED = ("int8", "fp8_e4m3")


class HostRows:
    """``slots`` rows of ``[heads, dim]`` in the ``kind`` form ("auto": ``dtype`` itself, which for
    a packed pool is its uint8 rows of ``dim = head_dim + 4``).

    Contract: ``put(idx, rows)`` stores ``rows [n, heads, dim]`` at host slots ``idx`` (any float
    dtype when quantized); ``get(idx)`` returns them in ``dtype`` (dequantized).  CPU tensors
    (pinned when ``pin``)."""

    def __init__(self, slots: int, heads: int, dim: int, dtype: torch.dtype, kind: str = "auto",
                 pin: bool = False) -> None:
        self.dtype, self.kind = dtype, kind
        self.quant = kind if kind in QUANTIZED else None
        shape = (slots, heads, kv_quant.packed_width(dim) if self.quant else dim)
        self.data = torch.zeros(shape, dtype=torch.uint8 if self.quant else dtype, pin_memory=pin)

    @staticmethod
    def slot_bytes(heads: int, dim: int, dtype: torch.dtype, kind: str = "auto") -> int:
        """Bytes one token's rows take in this form."""
        if kind in QUANTIZED:
            return heads * kv_quant.packed_width(dim)
        return heads * dim * torch.tensor([], dtype=dtype).element_size()

    def put(self, idx: torch.Tensor, rows: torch.Tensor) -> None:
        self.data.index_copy_(0, idx, kv_quant.quantize(rows, self.quant) if self.quant else rows.to(self.dtype))

    def get(self, idx: torch.Tensor) -> torch.Tensor:
        rows = self.data.index_select(0, idx)
        return kv_quant.dequantize(rows, self.quant, self.dtype) if self.quant else rows
