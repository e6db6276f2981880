"""Weights in the blocked low-bit layout of the native ``blocked_linear`` kernel.

``kernels/cpu/blocked_linear.cpp`` computes ``y = x @ W.T`` for ``W ~ d * u + m`` per group of
32 inputs of each output channel, ``u`` unsigned 4- or 8-bit codes, ``d`` and ``m`` fp16; the
activations are split per group of 32 inputs into two int8 parts (llama.cpp's Q8 rounding and
the rounding of its residual: ~15 bits, as bf16 activations need) and multiplied with VNNI's
integer dot products.  Its layout (16 output channels per record, one
record per group, codes and then scales) is written here.

* 4 bits hold GGUF Q4_1's grid, which is also ``quant.quantize_int4``'s: ``u = q``, ``d =
  scale``, ``m = zero - 8 scale``.
* 8 bits hold symmetric int8 with one scale per group: ``u = q + 128``, ``d = scale``, ``m =
  -128 scale`` (the LM head's format, ``head.py``).

``blocked_linear_exact(x, packed, bits)`` (``kernels/cpu/blocked_exact.cpp``) takes float32
activations as they are: each record is dequantized in float32 (``d * u + m``, exact but for
the one rounding of the sum, as a GGUF loader computes the weight) and multiplied in float32,
so where the packed grid holds the model's float32 weights bit for bit (``holds_exactly``: a
Q4_1 or Q8_0 GGUF) the layer computes what the dense float32 layer does, in another summation
order, while reading 4 or 8 bits a weight.

Contract: ``pack_blocked`` returns a new contiguous uint8 tensor ``[N / 16, K / 32, record]``;
``blocked_linear(x, packed, bits, in_scale)`` takes a contiguous ``x [M, K]`` (fp32 or bf16)
and returns a new ``[M, N]`` in ``x``'s dtype.  ``available(n, k)`` says whether the kernel
loads and takes the shape.
"""
from __future__ import annotations

from typing import Optional

import torch

from radixserve.kernels import cpu_native

GROUP = 32
CHANNELS = 16  # output channels per record


def available(n: int, k: int) -> bool:
    """Whether the native kernel is built here and takes a [n, k] weight."""
    return n % CHANNELS == 0 and k % GROUP == 0 and cpu_native.load() and \
        hasattr(torch.ops.radixserve_cpu, "blocked_linear")


def pack_blocked(u: torch.Tensor, d: torch.Tensor, m: torch.Tensor, bits: int) -> torch.Tensor:
    """The kernel's records for codes ``u`` [N, K] (integers in [0, 2**bits)) and per-group
    ``d``, ``m`` [N, K / 32] (rounded to fp16 here)."""
    n, k = u.shape
    if bits not in (4, 8) or n % CHANNELS or k % GROUP or d.shape != (n, k // GROUP) or m.shape != d.shape:
        raise ValueError(f"blocked: cannot pack a [{n}, {k}] weight with {bits} bits")
    nb, g = n // CHANNELS, k // GROUP
    u = u.to(torch.int32)
    if bits == 4:
        # (b, j, g, o, half, t) -> (b, g, o, j, t, half): byte 4 j + t of octet o, low/high nibble
        v = u.reshape(nb, CHANNELS, g, 4, 2, 4).permute(0, 2, 3, 1, 5, 4)
        codes = (v[..., 0] | (v[..., 1] << 4)).to(torch.uint8).reshape(nb, g, 256)
    else:
        codes = u.reshape(nb, CHANNELS, g, 8, 4).permute(0, 2, 3, 1, 4).to(torch.uint8).reshape(nb, g, 512)

    def halves(t: torch.Tensor) -> torch.Tensor:  # [N, G] -> [NB, G, 16] fp16
        return t.float().reshape(nb, CHANNELS, g).permute(0, 2, 1).to(torch.float16)

    scales = torch.cat([halves(d), halves(m)], -1).contiguous().view(torch.uint8)
    return torch.cat([codes, scales], -1).contiguous()


def unpack_blocked(packed: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(u int32 [N, K], d fp32 [N, K / 32], m fp32 [N, K / 32]): ``pack_blocked``'s inverse (d, m as fp16 held them)."""
    nb, g, rec = packed.shape
    wb = rec - 64
    codes, scales = packed[..., :wb].to(torch.int32), packed[..., wb:].contiguous().view(torch.float16).float()
    if bits == 4:
        v = torch.stack([codes & 15, codes >> 4], -1).reshape(nb, g, 4, CHANNELS, 4, 2)
        u = v.permute(0, 3, 1, 2, 5, 4).reshape(nb * CHANNELS, g * GROUP)
    else:
        u = codes.reshape(nb, g, 8, CHANNELS, 4).permute(0, 3, 1, 2, 4).reshape(nb * CHANNELS, g * GROUP)
    d = scales[..., :CHANNELS].permute(0, 2, 1).reshape(nb * CHANNELS, g)
    m = scales[..., CHANNELS:].permute(0, 2, 1).reshape(nb * CHANNELS, g)
    return u, d, m


def exact_available(n: int, k: int) -> bool:
    """Whether ``blocked_linear_exact`` is built here and takes a [n, k] weight."""
    return available(n, k) and hasattr(torch.ops.radixserve_cpu, "blocked_linear_exact")


def dequantize(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """The float32 weight [N, K] of the records: ``d * u + m`` (``d * u`` is exact, so this is
    the kernels' one rounding of the sum)."""
    u, d, m = unpack_blocked(packed, bits)
    n, k = u.shape
    return (u.float().reshape(n, -1, GROUP) * d.float()[..., None] + m.float()[..., None]).reshape(n, k)


def holds_exactly(packed: torch.Tensor, bits: int, weight: torch.Tensor) -> bool:
    """Whether the records hold the float32 ``weight`` bit for bit."""
    return torch.equal(dequantize(packed, bits), weight.detach().float())


def blocked_linear(x: torch.Tensor, packed: torch.Tensor, bits: int,
                   in_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
    return torch.ops.radixserve_cpu.blocked_linear(x.contiguous(), packed, bits, in_scale)


def reference(x: torch.Tensor, packed: torch.Tensor, bits: int, in_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The kernel's arithmetic in torch ops (for tests): x split per group into xh + xl / 254
    (int8 each, rounded in fp32 as the kernel does), exact integer dots, float64 sums."""
    u, d, m = unpack_blocked(packed, bits)
    xf = x.float() * (1.0 if in_scale is None else in_scale.float())
    rows, k = xf.shape
    xg = xf.reshape(rows, k // GROUP, GROUP)
    amax = xg.abs().amax(-1)
    s = torch.where(amax > 0, amax / 127, torch.ones(()))
    t = xg * (1 / s)[..., None]
    xh = torch.round(t)
    xl = torch.round((t - xh) * 254)
    ug = u.double().reshape(u.shape[0], k // GROUP, GROUP)
    dots = torch.einsum("mgk,ngk->mng", xh.double() * 254 + xl.double(), ug)
    ds = (s / 254).double()
    return (dots * d.double()[None] * ds[:, None, :] + m.double()[None] * xg.double().sum(-1)[:, None, :]).sum(-1)
