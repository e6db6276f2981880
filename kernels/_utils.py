"""Small helpers shared by the Triton kernels in this package (radixserve.kernels)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


def is_interpreted(kernel) -> bool:
    """True when ``kernel`` runs on Triton's CPU interpreter.  Triton decides this when the
    ``@triton.jit`` decorator runs (``TRITON_INTERPRET=1`` at import time), so ask the
    kernel object rather than the environment."""
    return type(kernel).__name__ == "InterpretedFunction"


def dot_flags(dtype: torch.dtype, kernel) -> tuple[bool, bool]:
    """``(UPCAST, IEEE)`` constexprs for :func:`_dot` when launching ``kernel``.

    UPCAST: triton 3.9's interpreter computes a bf16 x bf16 ``tl.dot`` on the raw bit
    patterns (garbage), so under the interpreter both operands are upcast to fp32.
    IEEE: fp32 inputs use exact fp32 products on the GPU instead of TF32.
    """
    return is_interpreted(kernel), dtype == torch.float32


def next_pow2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))


@triton.jit
def _dot(a, b, UPCAST: tl.constexpr, IEEE: tl.constexpr):
    """``a @ b`` accumulated in fp32 (see :func:`dot_flags`)."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    elif IEEE:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)
