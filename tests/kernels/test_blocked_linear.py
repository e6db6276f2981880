"""The native blocked low-bit linear (kernels/cpu/blocked_linear.cpp, model/quant/blocked.py):
packing, the kernel against a float64 replica of its arithmetic and against the
dequantized weights, its use by the int4 QuantLinear and the int8 LM head, and bad inputs."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixserve.kernels import cpu_native
from radixserve.model.quant import blocked
from radixserve.model.quant.linear import QuantLinear, dequantize_int4, quantize_int4

pytestmark = pytest.mark.skipif(not cpu_native.load(), reason="native CPU kernels did not build")


def _weights(n: int, k: int, bits: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    u = torch.randint(0, 2 ** bits, (n, k), generator=gen)
    d = torch.rand(n, k // 32, generator=gen) * 0.01 + 1e-3
    m = -torch.rand(n, k // 32, generator=gen) * 0.02 * (2 ** bits)
    return u, d, m


def _dense(u: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    return u.double() * d.double().repeat_interleave(32, 1) + m.double().repeat_interleave(32, 1)


@pytest.mark.parametrize("bits", [4, 8])
def test_pack_round_trip(bits):
    u, d, m = _weights(48, 96, bits, 1)
    packed = blocked.pack_blocked(u, d, m, bits)
    assert packed.dtype == torch.uint8 and packed.shape == (3, 3, 320 if bits == 4 else 576)
    u2, d2, m2 = blocked.unpack_blocked(packed, bits)
    assert torch.equal(u2, u)
    assert torch.equal(d2, d.half().float()) and torch.equal(m2, m.half().float())


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,k", [(16, 32), (48, 96), (960, 576), (80, 1536)])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9, 16, 37])  # 16 and more: AMX tiles where the CPU has them
def test_kernel_matches_its_arithmetic_and_the_dequantized_weights(bits, dtype, n, k, rows):
    u, d, m = _weights(n, k, bits, n + k + rows)
    packed = blocked.pack_blocked(u, d, m, bits)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows)).to(dtype)
    y = blocked.blocked_linear(x, packed, bits)
    assert y.dtype == dtype and y.shape == (rows, n)
    ref = blocked.reference(x, packed, bits)
    tol = 1e-5 if dtype == torch.float32 else 1e-2  # bf16: the output's own rounding
    assert (y.double() - ref).abs().max() <= tol * ref.abs().max()
    # against the weights themselves: x's two int8 parts hold it to 1/(127 * 508) of a group's max
    exact = x.double() @ _dense(*blocked.unpack_blocked(packed, bits)).t()
    assert (y.double() - exact).abs().max() <= max(tol, 2e-4) * exact.abs().max()


@pytest.mark.parametrize("bits", [4, 8])
def test_input_scale_is_applied_in_fp32(bits):
    u, d, m = _weights(32, 64, bits, 3)
    packed = blocked.pack_blocked(u, d, m, bits)
    gen = torch.Generator().manual_seed(4)
    x, s = torch.randn(3, 64, generator=gen).bfloat16(), torch.rand(64, generator=gen) * 4 + 0.1
    got = blocked.blocked_linear(x, packed, bits, s)
    want = blocked.blocked_linear(x.float() * s, packed, bits)
    torch.testing.assert_close(got.float(), want, rtol=1e-2, atol=1e-2 * float(want.abs().max()))
    assert (blocked.blocked_linear(x, packed, bits).float() - want).abs().max() > 0.1 * want.abs().max()


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("rows", [16, 17, 40])
def test_amx_tiles_and_vnni_give_the_same_numbers(bits, rows):
    """The AMX path (from 16 rows, where the CPU and the OS allow it) does the same integer
    products and fp32 epilogue as the VNNI one; with it off, the VNNI path runs every call."""
    u, d, m = _weights(48, 96, bits, rows)
    packed = blocked.pack_blocked(u, d, m, bits)
    x = torch.randn(rows, 96, generator=torch.Generator().manual_seed(rows))
    op = torch.ops.radixserve_cpu.blocked_amx_mode
    before = op(-1)
    try:
        assert op(0) == 0
        vnni = blocked.blocked_linear(x, packed, bits)
        amx_on = op(1) == 1
        tiles = blocked.blocked_linear(x, packed, bits)
    finally:
        op(before)
    torch.testing.assert_close(tiles, vnni, rtol=1e-6, atol=1e-6 * float(vnni.abs().max()))
    ref = blocked.reference(x, packed, bits)
    assert (tiles.double() - ref).abs().max() <= 1e-5 * ref.abs().max()
    if not amx_on:
        pytest.skip("no AMX-INT8 here: only the VNNI path ran")


def test_a_wrong_layout_fails_the_comparison():
    """The checks above can fail: nibbles packed in the wrong order give other numbers."""
    u, d, m = _weights(32, 64, 4, 5)
    good = blocked.pack_blocked(u, d, m, 4)
    bad = good.clone()
    codes = bad[..., :256]
    bad[..., :256] = (codes >> 4) | ((codes & 15) << 4)  # low and high nibbles swapped
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(6))
    ref = blocked.reference(x, good, 4)
    assert (blocked.blocked_linear(x, bad, 4).double() - ref).abs().max() > 0.05 * ref.abs().max()


def test_zero_rows_and_bad_inputs():
    packed = blocked.pack_blocked(*_weights(16, 64, 4, 7), 4)
    assert blocked.blocked_linear(torch.randn(0, 64), packed, 4).shape == (0, 16)
    with pytest.raises(RuntimeError, match="bits must be 4 or 8"):
        torch.ops.radixserve_cpu.blocked_linear(torch.randn(1, 64), packed, 5, None)
    with pytest.raises(RuntimeError, match="w must be contiguous uint8"):
        torch.ops.radixserve_cpu.blocked_linear(torch.randn(1, 64), packed, 8, None)
    with pytest.raises(RuntimeError, match="K = 32"):
        torch.ops.radixserve_cpu.blocked_linear(torch.randn(1, 96), packed, 4, None)
    with pytest.raises(RuntimeError, match="in_scale"):
        torch.ops.radixserve_cpu.blocked_linear(torch.randn(1, 64), packed, 4, torch.ones(32))
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        torch.ops.radixserve_cpu.blocked_linear(torch.randn(1, 64).half(), packed, 4, None)
    with pytest.raises(ValueError, match="cannot pack"):
        blocked.pack_blocked(torch.zeros(8, 64, dtype=torch.int32), torch.ones(8, 2), torch.ones(8, 2), 4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int4_quant_linear_runs_the_blocked_kernel(dtype):
    gen = torch.Generator().manual_seed(8)
    w, b = torch.randn(48, 96, generator=gen) * 0.05, torch.randn(48, generator=gen)
    layer = QuantLinear(w, b, "int4", dtype)
    assert layer.native and layer.q.dtype == torch.uint8 and layer.q.dim() == 3
    x = torch.randn(3, 96, generator=gen).to(dtype)
    ref = F.linear(x.float(), dequantize_int4(*quantize_int4(w.float())), b)
    assert (layer(x).float() - ref).abs().max() <= 0.02 * ref.abs().max()


def test_int4_without_the_blocked_kernel_uses_torchs(monkeypatch):
    monkeypatch.setattr(blocked, "available", lambda n, k: False)
    w = torch.randn(48, 96) * 0.05
    layer = QuantLinear(w, None, "int4", torch.bfloat16)
    assert not layer.native and layer.q.dim() == 2  # torch's int4pack layout, not the blocked records
    x = torch.randn(2, 96).bfloat16()
    ref = F.linear(x.float(), dequantize_int4(*quantize_int4(w)))
    assert (layer(x).float() - ref).abs().max() <= 0.02 * ref.abs().max()
