"""Quantized linear layers for the CPU, on torch's own kernels.

Formats (``N`` outputs, ``K`` inputs, weight ``W [N, K]``):

``int8``  per-output-channel symmetric: ``W ~ q * scale[:, None]``, ``q`` int8 in [-127, 127].
          Activations stay in the model dtype.  Kernel: the native ``int8_linear`` of
          ``kernels/cpu/int8_linear.cpp`` where the library builds (it rounds the activations to
          int16 per group of 64 inputs on AVX-512 CPUs: an error under 2^-15 of the group's
          largest value), else ``aten._weight_int8pack_mm``.  Both need K % 16 == 0 (in torch
          2.13 other K read out of bounds and return garbage or crash).  Measured on the
          development machine at decode shapes, 1 thread: native 93 us per SmolLM2 layer at
          M = 1 against 207 for torch's int8 and 192 for its int4 kernel.
``w8a8``  the same int8 weights, and activations quantized per token (symmetric, dynamic):
          ``y = (x_q @ q.T)[int32] * x_scale[:, None] * scale``.  Kernel: oneDNN's
          ``onednn.qlinear_pointwise`` (the x86 int8 path of inductor; the codes go in as u8 with
          zero point 128, see ``forward``) where oneDNN is built in and exact on this CPU, else
          the same integer product as float32 matrix products (``int8_matmul``: exact, and equal
          to ``aten._int_mm``'s, whose CPU path without VNNI is 10 to 20 times slower).
``int4``  asymmetric in groups of 32 inputs: ``W ~ (q - 8) * scale[n, g] + zero[n, g]``, ``q`` in
          [0, 15].  Float32 activations run ``blocked_linear_exact`` (float32 arithmetic on the
          exactly dequantized weights; ``grid_exact`` says whether those are the model's own
          float32 weights, as they are from a Q4_1 GGUF: then the layer differs from the dense one
          by the summation order only).  Measured on the AVX2 EPYC (2 threads, SmolLM2's 4
          shapes x 30 layers): 8.1 ms a step at M = 1 against 11-18 for dense float32, 9.9
          against 34 at M = 4, 18 against 31-36 at M = 8, 181 against 161 at M = 64.
          Otherwise the native ``blocked_linear`` (``model/quant/blocked.py``: activations split
          per group of 32 inputs into two int8 parts, ~15 bits; VNNI integer dot products, AMX
          tiles from 16 rows) where the library builds and N % 16 == 0, else
          ``aten._weight_int4pack_mm_for_cpu`` (K % 32 == 0 and N % 16 == 0).  Measured on the
          development machine (AMX Xeon, 2 threads, SmolLM2's 4 shapes x 30 layers, bf16
          activations): 1.80 ms a decode step at M = 1 against 3.29 for torch's kernel, 2.69
          against 5.55 at M = 4, 7.99 against 19.76 at M = 16.
          This is GGUF Q4_1's grid (``w = d * q + m`` in blocks of 32: scale = d, zero = m + 8d):
          min/max quantization of Q4_1-dequantized weights gets ``q``, ``d`` and ``m`` back exactly
          (measured: zero error on SmolLM2's weights), so a GGUF needs no special repacking.

Input-channel scales: a layer may quantize ``W * s[None, :]`` and feed ``x / s`` (the same
product), with ``s`` searched per layer on calibration activations (``search_in_scale``): the
candidate (no scaling, AWQ's ``mean|x|**a`` for weight-only methods, SmoothQuant's
``max|x|**a / max|W|**(1 - a)`` for w8a8) whose simulated output is closest to fp32's.  On
SmolLM2-135M this took int8's teacher-forced agreement from ~96% to over 97%.

Layers whose shape a kernel does not support stay dense (``quantize_linears`` reports them).
A ``QuantLinear`` may also keep the dense weight and use it for calls with more than ``max_m``
rows (the quantized kernels win only at small M on some CPUs); that costs the dense weight's
memory on top of the quantized one.
"""
from __future__ import annotations

import functools
import logging
from typing import Optional

import torch
from torch import nn

from radixserve.kernels import cpu_native
from radixserve.model.quant import blocked

logger = logging.getLogger(__name__)

METHODS = ("int8", "w8a8", "int4")
FORMAT_VERSION = 12  # bump when a kernel's numerics change: cached accuracy checks depend on it (7: bf16 attention on
# AMX; 8: the native int8 kernel applies input scales in fp32; 12: int4 and the int8 head on the blocked kernel,
# the residual stream in fp32)
INT4_GROUP = 32
ALPHAS = (0.125, 0.25, 0.375, 0.5, 0.625, 0.75)  # exponents tried by search_in_scale


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8 [N, K], scale fp32 [N]) with ``w ~ q * scale[:, None]`` (round to nearest)."""
    w = w.float()
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale.float()[:, None]


def quantize_int4(w: torch.Tensor, group: int = INT4_GROUP) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q int32 [N, K] in 0..15, scale fp32 [N, K/group], zero fp32 [N, K/group]) with
    ``w ~ (q - 8) * scale + zero`` per group (min/max over each group of ``group`` inputs)."""
    n, k = w.shape
    g = w.float().reshape(n, k // group, group)
    lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    scale = ((hi - lo) / 15).clamp(min=1e-12)
    q = torch.round((g - lo) / scale).clamp(0, 15).to(torch.int32).reshape(n, k)
    return q, scale.reshape(n, -1), (lo + 8 * scale).reshape(n, -1)


def dequantize_int4(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group: int = INT4_GROUP) -> torch.Tensor:
    n, k = q.shape
    qg = q.float().reshape(n, k // group, group)
    return ((qg - 8) * scale.float()[..., None] + zero.float()[..., None]).reshape(n, k)


def fake_quantize(method: str, w: torch.Tensor) -> torch.Tensor:
    """``w`` (fp32) rounded to ``method``'s weight grid, dequantized."""
    if method == "int4":
        return dequantize_int4(*quantize_int4(w))
    return dequantize_int8(*quantize_int8(w))


def _simulate(method: str, w: torch.Tensor, x: torch.Tensor, s: Optional[torch.Tensor]) -> torch.Tensor:
    if s is not None:
        w, x = w * s, x / s
    if method == "w8a8":
        x_scale = x.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127
        x = torch.round(x / x_scale).clamp(-127, 127) * x_scale
    return x @ fake_quantize(method, w).t()


def search_in_scale(method: str, w: torch.Tensor, x: torch.Tensor) -> Optional[torch.Tensor]:
    """The input-channel scale (None: none) whose simulated ``method`` output on activations
    ``x [T, K]`` has the least squared error against ``x @ w.T`` (both fp32); see the module
    docstring for the candidates.  No scaling is a candidate, so this never does worse than
    plain rounding on ``x``."""
    ref = x @ w.t()
    best, best_err = None, float((_simulate(method, w, x, None) - ref).pow(2).sum())
    if best_err <= 1e-10 * float(ref.pow(2).sum()):  # the grid holds w exactly (int4 from a GGUF Q4_1)
        return None
    x_mean, x_max = x.abs().mean(0).clamp(min=1e-5), x.abs().amax(0).clamp(min=1e-5)
    w_max = w.abs().amax(0).clamp(min=1e-5)
    for a in ALPHAS:
        s = x_max ** a / w_max ** (1 - a) if method == "w8a8" else x_mean ** a
        s = s / s.mean()
        err = float((_simulate(method, w, x, s) - ref).pow(2).sum())
        if err < best_err:
            best, best_err = s, err
    return best


def supports(method: str, n: int, k: int) -> bool:
    """Whether ``method``'s kernel handles a [n, k] weight."""
    if method == "int8":
        return k % 16 == 0
    if method == "int4":
        return k % INT4_GROUP == 0 and n % 16 == 0
    return method == "w8a8"


@functools.lru_cache(maxsize=None)
def _onednn() -> bool:
    """True when oneDNN's u8 x s8 linear is built in and exact on this CPU.

    Without VNNI (AVX2 only: AMD Zen 3, older Xeons) oneDNN sums u8 x s8 pairs with
    ``vpmaddubsw``, which saturates at 32767: codes near 255 and 127 give wrong products (20% of
    the output's range on a random 96 x 64 layer, measured on an AVX2 EPYC).  One product of
    the extreme codes, checked against its exact value, tells; otherwise ``int8_matmul``."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.onednn, "qlinear_pointwise")):
        return False
    k, n = 64, 16
    w = torch.full((n, k), 127, dtype=torch.int8)
    w[1::2] = -127
    x = torch.full((2, k), 255, dtype=torch.uint8)  # code +127 at zero point 128
    want = torch.tensor([127.0 * 127 * k, -127.0 * 127 * k]).repeat(n // 2)
    try:
        y = torch.ops.onednn.qlinear_pointwise(x, 1.0, 128, torch.ops.onednn.qlinear_prepack(w, None),
                                               torch.ones(n), torch.zeros(n, dtype=torch.int64), None, 1.0, 0,
                                               torch.float32, "none", [], "")
    except RuntimeError:
        return False
    return bool(torch.equal(y, want.expand(2, n)))


EXACT_K = 1024  # 1024 products of int8 codes (each at most 128 * 128 = 2^14 in size) sum to at most 2^24


def int8_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``torch._int_mm(a, b)`` (int8 codes ``a [M, K]`` times ``b [K, N]``, summed exactly) as
    float32, computed as float32 matrix products of at most ``EXACT_K`` inputs each: every
    partial sum is an integer of at most 2^24, which float32 holds exactly, whatever the order
    of the sums; longer rows add their blocks' exact sums in float64, then round once.  Equal
    bit for bit to ``_int_mm(a, b).float()`` (``a`` may be float32 holding the codes)."""
    if torch.get_float32_matmul_precision() != "highest":  # float32 products may round their inputs
        return (a.double() @ b.double()).float()
    a = a.float()
    k = a.shape[1]
    if k <= EXACT_K:
        return a @ b.float()
    out = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float64)
    for k0 in range(0, k, EXACT_K):
        out += (a[:, k0: k0 + EXACT_K] @ b[k0: k0 + EXACT_K].float()).double()
    return out.float()


def _dense_layer(weight: torch.Tensor, bias: Optional[torch.Tensor], dtype: torch.dtype) -> nn.Linear:
    """An inference-only ``nn.Linear`` holding ``weight`` and ``bias`` in ``dtype``."""
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    layer.weight = nn.Parameter(weight.detach().to(dtype), requires_grad=False)
    if bias is not None:
        layer.bias = nn.Parameter(bias.detach().to(dtype), requires_grad=False)
    return layer


class QuantLinear(nn.Module):
    """``y = x @ W.T + b`` with ``W`` held quantized by ``method`` (see the module docstring).

    Contract: ``forward`` takes ``x [..., K]`` in ``act_dtype`` and returns ``[..., N]`` in
    ``act_dtype``, equal to ``F.linear(x, dequantized W, b)`` up to the kernel's rounding (w8a8
    also rounds ``x`` to int8 per token); with ``in_scale`` the kernel computes on
    ``W * in_scale`` and ``x / in_scale``.  With ``max_m`` set, calls with more than ``max_m``
    rows run the original weight instead (``dense``, a plain ``nn.Linear`` in ``act_dtype``).  The kernel
    tensors are plain attributes, not parameters: ``Module.to`` leaves them alone, and the
    layer cannot be trained or moved to another device.
    """

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor], method: str, act_dtype: torch.dtype,
                 max_m: Optional[int] = None, in_scale: Optional[torch.Tensor] = None) -> None:
        super().__init__()
        n, k = weight.shape
        if method not in METHODS or not supports(method, n, k):
            raise ValueError(f"quantization: {method} cannot hold a [{n}, {k}] weight")
        self.method, self.act_dtype, self.max_m = method, act_dtype, max_m
        self.in_features, self.out_features = k, n
        self.bias = None if bias is None else bias.detach().to(act_dtype)
        # the large-M path, a plain nn.Linear child (so packed_linear.pack_linears packs it like any other)
        self.dense = _dense_layer(weight, bias, act_dtype) if max_m is not None else None
        weight = weight.detach().float()
        self.inv_scale, self.native = None, False
        on_cpu = weight.device.type == "cpu"
        native = on_cpu and (blocked.available(n, k) if method == "int4" else method == "int8" and cpu_native.load())
        if in_scale is not None:
            weight = weight * in_scale.float()
            fp32 = method == "w8a8" or native  # the native kernels take fp32 scales
            self.inv_scale = (1 / in_scale.float()).to(torch.float32 if fp32 else act_dtype).contiguous()
        self.exact = self.grid_exact = False  # float32 activations on blocked_linear_exact
        if method == "int4":
            q, scale, zero = quantize_int4(weight)
            self.native = native
            if native:
                self.q = blocked.pack_blocked(q, scale, zero - 8 * scale, 4)
                self.exact = act_dtype == torch.float32 and blocked.exact_available(n, k)
                # whether the float32 arithmetic is the dense layer's (up to the summation order)
                self.grid_exact = self.exact and in_scale is None and blocked.holds_exactly(self.q, 4, weight)
                return
            self.q = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
            # [K/group, N, 2] in the activation dtype, as the kernel wants
            self.scale = torch.stack([scale, zero], -1).transpose(0, 1).contiguous().to(act_dtype)
            return
        q, scale = quantize_int8(weight)
        if method == "int8":
            self.native = native
            self.q, self.scale = q, scale if self.native else scale.to(act_dtype)
        else:
            self.use_onednn = _onednn()
            self.scale = scale
            self.zero_points = torch.zeros(n, dtype=torch.int64)
            self.q = torch.ops.onednn.qlinear_prepack(q, None) if self.use_onednn else q.t().contiguous()

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, method={self.method}, "
                f"act_dtype={self.act_dtype}, max_m={self.max_m}")

    def _native_call(self) -> Optional[tuple]:
        """(op overload, trailing args) of the native kernel, or None: bound once, so that a decode
        call is one op call (the packet lookup and the branches cost ~2 us of a ~15 us call)."""
        if not self.native:
            return None
        if self.exact:
            return None if self.inv_scale is not None else (torch.ops.radixserve_cpu.blocked_linear_exact.default, (self.q, 4))
        if self.method == "int4":
            return torch.ops.radixserve_cpu.blocked_linear.default, (self.q, 4, self.inv_scale)
        return torch.ops.radixserve_cpu.int8_linear.default, (self.q, self.scale, self.inv_scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fast = self.__dict__.get("_fast")
        if fast is None:
            fast = self.__dict__["_fast"] = self._native_call() or ()
        if fast and self.bias is None and x.dim() == 2 and (self.max_m is None or x.shape[0] <= self.max_m):
            return fast[0](x.contiguous(), *fast[1])
        flat = x.dim() == 2  # the model's activations are [tokens, features]: no reshapes (decode is op-bound)
        x2 = x if flat else x.reshape(-1, self.in_features)
        if self.dense is not None and x2.shape[0] > self.max_m:
            return self.dense(x)
        y = self._kernel(x2)
        if self.bias is not None:
            y = y + self.bias
        return y if flat else y.reshape(*x.shape[:-1], self.out_features)

    def _kernel(self, x: torch.Tensor) -> torch.Tensor:
        if self.exact:
            x = x if self.inv_scale is None else x * self.inv_scale
            return torch.ops.radixserve_cpu.blocked_linear_exact(x.contiguous(), self.q, 4)
        if self.native:  # the native kernels apply the input scale themselves
            if self.method == "int4":
                return torch.ops.radixserve_cpu.blocked_linear(x.contiguous(), self.q, 4, self.inv_scale)
            return torch.ops.radixserve_cpu.int8_linear(x.contiguous(), self.q, self.scale, self.inv_scale)
        if self.method != "w8a8" and self.inv_scale is not None:
            x = x * self.inv_scale
        if self.method == "int8":
            return torch.ops.aten._weight_int8pack_mm(x, self.q, self.scale)
        if self.method == "int4":
            return torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.q, INT4_GROUP, self.scale)
        xf = x.float() if self.inv_scale is None else x.float() * self.inv_scale
        x_scale = xf.abs().amax(dim=1, keepdim=True).clamp_(min=1e-12) / 127
        xq = (xf / x_scale).round_().clamp_(-127, 127)
        if self.use_onednn:
            # u8 codes with zero point 128 (the same product): oneDNN has JIT u8 x s8 kernels on every
            # VNNI CPU, but s8 x s8 runs its scalar reference on some (AMD Zen 4: 124 ms against 0.07 ms
            # for 16 x 576 x 576, measured; ONEDNN_VERBOSE=dispatch says "not supported on this isa").
            xq = xq.add_(128).to(torch.uint8)
            y = torch.ops.onednn.qlinear_pointwise(xq, 1.0, 128, self.q, self.scale, self.zero_points, None, 1.0, 0,
                                                   torch.float32, "none", [], "")
        else:
            y = int8_matmul(xq, self.q) * self.scale  # xq holds the codes (integers in float32)
        return y.mul_(x_scale).to(x.dtype)


def quantize_linears(model: nn.Module, method: str, act_dtype: torch.dtype, max_m: Optional[int] = None,
                     in_scales: Optional[dict[str, torch.Tensor]] = None,
                     skip: tuple[str, ...] = ("lm_head",)) -> tuple[int, list[str]]:
    """Replace every ``nn.Linear`` of ``model`` (but those named in ``skip``) by a QuantLinear
    built from its weight (quantize from fp32 weights for the best accuracy) and its entry in
    ``in_scales`` (by module name), if any.  Returns (how many were replaced, the names of
    those left dense because ``method``'s kernel cannot take them)."""
    if method not in METHODS:
        raise ValueError(f"quantization: unknown method {method!r} ({', '.join(METHODS)})")
    done, left = 0, []
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if not isinstance(child, nn.Linear) or child_name in skip:
                continue
            full = f"{name}.{child_name}" if name else child_name
            if not supports(method, child.out_features, child.in_features):
                left.append(full)
                continue
            scale = (in_scales or {}).get(full)
            setattr(module, child_name, QuantLinear(child.weight, child.bias, method, act_dtype, max_m, scale))
            done += 1
    if left:
        logger.warning("quantization %s: %d linear layers stay dense (shape not supported), e.g. %s",
                       method, len(left), left[0])
    exact = [m for m in model.modules() if isinstance(m, QuantLinear) and m.exact]
    if exact:
        held = sum(m.grid_exact for m in exact)
        logger.info("quantization %s with float32 activations: float32 arithmetic; %d of %d layers hold the "
                    "model's float32 weights bit for bit", method, held, len(exact))
    return done, left
