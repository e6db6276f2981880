"""Quantized KV rows: the packed form a quantized pool and the host tier store.

A token's K (or V) for one KV head is ``head_dim`` one-byte codes followed by its fp32 scale
(little-endian), ``head_dim + 4`` bytes in all: the head's largest magnitude maps to the format's
largest finite value (127 for int8, 448 for fp8_e4m3, 57344 for fp8_e5m2), and a value is
``code * scale``.  Keeping the scale in the row means every copy of rows (the host and disk tiers,
warm restart, index_select/index_copy) moves codes and scales together with no second buffer.
A buffer of packed rows is uint8 ``[slots, heads, head_dim + 4]``; ``head_dim`` must be a multiple
of 4 so that the scale is 4-byte aligned (``scales`` views it as fp32 without a copy).
"""
from __future__ import annotations

from typing import Optional

import torch

# kind -> (the code's dtype, its largest finite magnitude)
FORMATS: dict[str, tuple[torch.dtype, float]] = {
    "int8": (torch.int8, 127.0),
    "fp8_e4m3": (torch.float8_e4m3fn, 448.0),
    "fp8_e5m2": (torch.float8_e5m2, 57344.0),
}
SCALE_BYTES = 4


def is_quantized(kind: Optional[str]) -> bool:
    return kind in FORMATS


def packed_width(head_dim: int) -> int:
    """Bytes of one packed head row."""
    return head_dim + SCALE_BYTES


def check_head_dim(head_dim: int) -> None:
    if head_dim % 4:
        raise ValueError(f"kv_cache_dtype: a quantized KV needs head_dim divisible by 4 (this model's is {head_dim})")


def quantize(x: torch.Tensor, kind: str) -> torch.Tensor:
    """``x [..., heads, head_dim]`` (any float dtype) -> packed uint8 ``[..., heads, head_dim + 4]``."""
    code, qmax = FORMATS[kind]
    d = x.shape[-1]
    xf = x.float()
    scale = xf.abs().amax(-1, keepdim=True).clamp_(min=1e-30) / qmax
    q = xf / scale
    codes = q.round_().clamp_(-qmax, qmax).to(torch.int8) if kind == "int8" else q.to(code)
    out = torch.empty(*x.shape[:-1], d + SCALE_BYTES, dtype=torch.uint8, device=x.device)
    out[..., :d] = codes.view(torch.uint8)
    out.view(torch.float32)[..., d // 4] = scale.squeeze(-1)
    return out


def codes(packed: torch.Tensor, kind: str) -> torch.Tensor:
    """The codes of packed rows, viewed in the format's dtype (no copy)."""
    return packed[..., : packed.shape[-1] - SCALE_BYTES].view(FORMATS[kind][0])


def scales(packed: torch.Tensor) -> torch.Tensor:
    """The fp32 scale of each packed row, ``[..., heads]`` (a view; ``packed`` contiguous)."""
    return packed.view(torch.float32)[..., (packed.shape[-1] - SCALE_BYTES) // 4]


def dequantize(packed: torch.Tensor, kind: str, dtype: torch.dtype) -> torch.Tensor:
    """Packed rows -> ``[..., heads, head_dim]`` in ``dtype`` (``code * scale`` in fp32, then rounded)."""
    return (codes(packed, kind).float() * scales(packed).unsqueeze(-1)).to(dtype)
