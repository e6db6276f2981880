"""The blocked low-bit layout on float32 activations (kernels/cpu/blocked_exact.cpp): float32
arithmetic on the exactly dequantized weights, within the error bound of a float32 sum of K
products; each row's result independent of the rows beside it (bit for bit: every (row,
channel) sum is one FMA per input, in input order, whatever the batch); its use by the int4
QuantLinear and the int8 head on float32 activations; bad inputs."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixserve.kernels import cpu_native
from radixserve.model.quant import blocked
from radixserve.model.quant.head import Int8HeadLinear
from radixserve.model.quant.linear import QuantLinear

pytestmark = pytest.mark.skipif(not cpu_native.load(), reason="native CPU kernels did not build")
EPS = 2.0 ** -24


def _grid_weights(n: int, k: int, bits: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(float32 weight on a GGUF-like grid: fp16 d and m, codes of ``bits``; its records)."""
    gen = torch.Generator().manual_seed(seed)
    u = torch.randint(0, 2 ** bits, (n, k), generator=gen)
    u[:, 0::32], u[:, 1::32] = 0, 2 ** bits - 1  # each group uses both ends, as Q4_1's min/max blocks do
    d = (torch.rand(n, k // 32, generator=gen) * 0.01 + 1e-3).half().float()
    m = (-torch.rand(n, k // 32, generator=gen) * 0.005 * 2 ** bits).half().float()
    packed = blocked.pack_blocked(u, d, m, bits)
    return blocked.dequantize(packed, bits), packed


def _within_float32_sum_bound(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> None:
    """|y - x w^T| <= K eps sum |x| |w| (with a 1% margin): any order of K float32 FMAs."""
    ref = x.double() @ w.double().t()
    bound = (x.double().abs() @ w.double().abs().t()) * x.shape[1] * EPS * 1.01
    assert ((y.double() - ref).abs() <= bound).all(), float(((y.double() - ref).abs() / bound.clamp(min=1e-30)).max())


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("n,k", [(16, 32), (48, 96), (960, 576), (80, 1536)])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 9, 17])
def test_exact_kernel_is_a_float32_product_of_the_dequantized_weights(bits, n, k, rows):
    w, packed = _grid_weights(n, k, bits, n + k + bits)
    assert blocked.holds_exactly(packed, bits, w)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
    y = torch.ops.radixserve_cpu.blocked_linear_exact(x, packed, bits)
    assert y.dtype == torch.float32 and y.shape == (rows, n)
    _within_float32_sum_bound(y, x, w)
    # against F.linear on the dense float32 weight: the same products, another order
    assert torch.allclose(y, F.linear(x, w), rtol=1e-4, atol=1e-5 * float(F.linear(x, w).abs().max()))


@pytest.mark.parametrize("bits", [4, 8])
def test_each_row_is_the_same_bits_in_any_batch(bits):
    w, packed = _grid_weights(96, 160, bits, 7)
    x = torch.randn(13, 160, generator=torch.Generator().manual_seed(3))
    whole = torch.ops.radixserve_cpu.blocked_linear_exact(x, packed, bits)
    for i in range(13):
        assert torch.equal(torch.ops.radixserve_cpu.blocked_linear_exact(x[i:i + 1], packed, bits), whole[i:i + 1])
    perm = torch.randperm(13, generator=torch.Generator().manual_seed(1))
    assert torch.equal(torch.ops.radixserve_cpu.blocked_linear_exact(x[perm].contiguous(), packed, bits), whole[perm])
    assert torch.equal(torch.ops.radixserve_cpu.blocked_linear_exact(x[2:7].contiguous(), packed, bits), whole[2:7])


def test_int4_layer_on_float32_activations_runs_float32_arithmetic():
    w, _ = _grid_weights(96, 128, 4, 11)  # a Q4_1 grid: the layer holds the weight bit for bit
    bias = torch.randn(96)
    layer = QuantLinear(w, bias, "int4", torch.float32)
    assert layer.exact and layer.grid_exact
    x = torch.randn(2, 5, 128)
    y = layer(x)
    assert y.shape == (2, 5, 96)
    _within_float32_sum_bound((y - bias).reshape(10, 96), x.reshape(10, 128), w)
    off_grid = QuantLinear(torch.randn(96, 128) * 0.05, None, "int4", torch.float32)
    assert off_grid.exact and not off_grid.grid_exact  # quantized: the kernel is exact, the weight is not
    assert not QuantLinear(w, None, "int4", torch.bfloat16).exact
    # the hybrid: above max_m rows the dense float32 weight, below the exact kernel
    hybrid = QuantLinear(w, None, "int4", torch.float32, max_m=4)
    x8 = torch.randn(8, 128)
    assert torch.equal(hybrid(x8), F.linear(x8, w))
    assert torch.equal(hybrid(x8[:4]), torch.ops.radixserve_cpu.blocked_linear_exact(x8[:4].contiguous(), hybrid.q, 4))


def test_int8_head_on_float32_activations():
    w, _ = _grid_weights(64, 96, 8, 5)
    codes = torch.round(w.reshape(64, 3, 32) / w.reshape(64, 3, 32).abs().amax(-1, keepdim=True) * 127)
    q8 = (codes * (w.reshape(64, 3, 32).abs().amax(-1, keepdim=True) / 127)).reshape(64, 96)  # symmetric, Q8_0-like
    head = Int8HeadLinear(q8, exact=True)
    assert head.exact and "blocked_linear_exact" in repr(head)
    x = torch.randn(3, 96)
    _within_float32_sum_bound(head(x), x, head.dequantized())


def test_bad_inputs_are_refused():
    _, packed = _grid_weights(16, 64, 4, 1)
    op = torch.ops.radixserve_cpu.blocked_linear_exact
    with pytest.raises(RuntimeError, match="float32"):
        op(torch.randn(2, 64).bfloat16(), packed, 4)
    with pytest.raises(RuntimeError, match="K = 32"):
        op(torch.randn(2, 96), packed, 4)
    with pytest.raises(RuntimeError, match="bits"):
        op(torch.randn(2, 64), packed, 5)
    with pytest.raises(RuntimeError, match="contiguous uint8"):
        op(torch.randn(2, 64), packed, 8)
    assert op(torch.randn(0, 64), packed, 4).shape == (0, 16)
