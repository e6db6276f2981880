"""Quantized linear layers (radixserve/model/quant/linear.py), their calibration (model/quant/calibration.py),
and the ``quantization`` option of ModelConfig, the CLI and the Engine.  Correctness only."""
from __future__ import annotations

import argparse

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from radixserve import cli
from radixserve.config import EngineConfig, ModelConfig
from radixserve.kernels import cpu_native
from radixserve.model.quant import calibration, linear as quant
from radixserve.model.quant.linear import (METHODS, QuantLinear, dequantize_int4, dequantize_int8, fake_quantize,
                                    quantize_int4, quantize_int8, quantize_linears, search_in_scale, supports)

torch.manual_seed(0)
W = torch.randn(96, 64) * 0.1
B = torch.randn(96)


def test_int8_round_trip():
    q, scale = quantize_int8(W)
    assert q.dtype == torch.int8 and int(q.abs().max()) == 127 and scale.shape == (96,)
    assert ((dequantize_int8(q, scale) - W).abs() <= scale[:, None] / 2 + 1e-7).all()
    on_grid = dequantize_int8(q, scale)  # values on the grid come back unchanged
    assert torch.equal(quantize_int8(on_grid)[0], q)


def test_int4_round_trip_and_the_q4_1_grid():
    q, scale, zero = quantize_int4(W)
    assert q.min() >= 0 and q.max() <= 15 and scale.shape == zero.shape == (96, 2)
    err = (dequantize_int4(q, scale, zero) - W).abs().reshape(96, 2, 32)
    assert (err <= scale[..., None] / 2 + 1e-6).all()
    # GGUF Q4_1 blocks (w = d * q + m, q in 0..15, both ends used) come back exactly
    d, m = torch.rand(96, 2, 1) * 0.01 + 1e-3, torch.randn(96, 2, 1) * 0.05
    qs = torch.randint(0, 16, (96, 2, 32))
    qs[..., 0], qs[..., 1] = 0, 15
    q41 = (d * qs + m).reshape(96, 64)
    q2, s2, z2 = quantize_int4(q41)
    assert torch.equal(q2, qs.reshape(96, 64).int()) and torch.allclose(dequantize_int4(q2, s2, z2), q41, atol=1e-7)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_quant_linear_matches_f_linear_with_the_dequantized_weight(method, dtype):
    layer = QuantLinear(W, B, method, dtype)
    x = torch.randn(2, 5, 64)
    y = layer(x.to(dtype))
    assert y.dtype == dtype and y.shape == (2, 5, 96)
    ref = F.linear(x, fake_quantize(method, W), B)
    tol = 0.03 if method == "w8a8" or dtype == torch.bfloat16 else 1e-4  # w8a8 also rounds x to int8
    if method == "int4" and layer.native and dtype == torch.float32:
        tol = 2e-3  # the blocked kernel holds scale and min in fp16 (2^-11), as GGUF's Q4_1 does
    assert (y.float() - ref).abs().max() <= tol * ref.abs().max()


def test_w8a8_without_onednn_uses_the_exact_integer_product(monkeypatch):
    x = torch.randn(7, 64).bfloat16()
    want = QuantLinear(W, B, "w8a8", torch.bfloat16)(x)
    monkeypatch.setattr(quant, "_onednn", lambda: False)
    layer = QuantLinear(W, B, "w8a8", torch.bfloat16)
    assert not layer.use_onednn and layer.q.dtype == torch.int8
    assert torch.allclose(layer(x).float(), want.float(), atol=1e-2, rtol=1e-2)
    # the layer's own arithmetic, step by step, with aten._int_mm's integer product
    xf = x.float()
    x_scale = xf.abs().amax(dim=1, keepdim=True).clamp_(min=1e-12) / 127
    xq = (xf / x_scale).round_().clamp_(-127, 127).to(torch.int8)
    ref = ((torch._int_mm(xq, layer.q) * layer.scale).mul_(x_scale).to(torch.bfloat16) + layer.bias)
    assert torch.equal(layer(x), ref)


@pytest.mark.parametrize("k", [64, quant.EXACT_K, quant.EXACT_K + 16, 2 * quant.EXACT_K + 48])
@pytest.mark.parametrize("precision", ["highest", "medium"])
def test_int8_matmul_is_int_mm_bit_for_bit(k, precision):
    # random codes, and rows and columns of extreme codes whose products all add up (the
    # largest sums a row can reach: a float32 sum of more than EXACT_K of them would round)
    g = torch.Generator().manual_seed(k)
    a = torch.randint(-128, 128, (33, k), dtype=torch.int8, generator=g)
    b = torch.randint(-128, 128, (k, 40), dtype=torch.int8, generator=g)
    a[0], a[1], b[:, 0], b[:, 1] = -128, 127, -128, 127
    a[2, ::2], a[2, 1::2] = 127, -127
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        got = quant.int8_matmul(a, b)
        got_from_float_codes = quant.int8_matmul(a.float(), b)
    finally:
        torch.set_float32_matmul_precision(saved)
    want = torch._int_mm(a, b)
    assert int(want.abs().max()) == 128 * 128 * k  # the extremes were reached
    assert got.dtype == torch.float32 and torch.equal(got, want.float()) and torch.equal(got_from_float_codes, got)


@pytest.mark.parametrize("method", METHODS)
def test_an_input_scale_keeps_the_product(method):
    s = torch.rand(64) + 0.5
    x = torch.randn(4, 64)
    y = QuantLinear(W, None, method, torch.float32, in_scale=s)(x)
    ref = F.linear(x / s, fake_quantize(method, W * s))
    assert (y - ref).abs().max() <= 0.03 * ref.abs().max()
    coarse = 0.2 if method == "int4" else 0.05  # 4 bits on Gaussian weights: the grid itself is coarse
    assert float((y - F.linear(x, W)).abs().max()) <= coarse * float(ref.abs().max())


def test_max_m_runs_the_dense_weight_for_larger_calls():
    layer = QuantLinear(W, B, "int8", torch.bfloat16, max_m=4)
    pure = QuantLinear(W, B, "int8", torch.bfloat16)
    small, large = torch.randn(4, 64).bfloat16(), torch.randn(5, 64).bfloat16()
    assert torch.equal(layer(small), pure(small))
    assert torch.equal(layer(large), F.linear(large, W.bfloat16(), B.bfloat16()))
    assert pure.dense is None  # a pure method keeps no dense copy


def test_shapes_a_kernel_cannot_take_stay_dense():
    # torch 2.13's int8 kernel reads out of bounds for K % 16 != 0; int4 packs N by 16
    assert supports("int8", 8, 16) and not supports("int8", 8, 24)
    assert supports("int4", 16, 32) and not supports("int4", 8, 32) and not supports("int4", 16, 48)
    assert supports("w8a8", 3, 7)
    with pytest.raises(ValueError, match="^quantization: int8 cannot hold a \\[8, 24\\] weight"):
        QuantLinear(torch.randn(8, 24), None, "int8", torch.bfloat16)
    model = nn.Sequential(nn.Linear(64, 32), nn.Linear(24, 64))
    model.lm_head = nn.Linear(64, 10)
    done, left = quantize_linears(model, "int8", torch.float32)
    assert done == 1 and left == ["1"] and isinstance(model[0], QuantLinear)
    assert type(model[1]) is nn.Linear and type(model.lm_head) is nn.Linear  # the LM head is never quantized
    with pytest.raises(ValueError, match="^quantization: unknown method"):
        quantize_linears(model, "fp8", torch.float32)


def test_search_in_scale():
    # activations with a few large channels: SmoothQuant-style scales cut w8a8's error
    x = torch.randn(128, 64)
    x[:, :3] *= 40
    s = search_in_scale("w8a8", W, x)
    assert s is not None and s.shape == (64,) and s[:3].min() > s[3:].max()

    def err(scale):
        y = QuantLinear(W, None, "w8a8", torch.float32, in_scale=scale)(x)
        return float((y - x @ W.t()).pow(2).sum())
    assert err(s) < err(None)
    # weights already on the int4 grid need no scaling
    assert search_in_scale("int4", dequantize_int4(*quantize_int4(W)), x) is None


def test_teacher_forced_logits_match_hf(tiny_dir, tiny_hf):
    from radixserve.model import loader

    model = loader.load_model(loader.load_config(tiny_dir), tiny_dir, torch.float32, torch.device("cpu"), 64)
    seqs = [[5, 17, 300, 42, 9], [7, 7, 1000]]
    got = calibration.teacher_forced_logits(model, seqs)
    with torch.no_grad():
        want = torch.cat([tiny_hf(torch.tensor([s])).logits[0] for s in seqs])
    assert torch.allclose(got, want, atol=1e-4)


def test_config_and_cli_validate_quantization():
    assert ModelConfig().quantization == "auto"
    with pytest.raises(ValueError, match="^quantization: unknown method 'int3' \\(auto, none, int8, w8a8, int4\\)"):
        ModelConfig(quantization="int3")
    with pytest.raises(ValueError, match="^quantization:"):
        EngineConfig.from_kwargs(quantization="fp8")
    assert EngineConfig.from_kwargs(quantization="int4").model.quantization == "int4"
    parser = argparse.ArgumentParser()
    cli._engine_parser(parser)
    assert cli.engine_config_from_args(parser.parse_args(["--quantization", "w8a8"])).model.quantization == "w8a8"
    assert cli.engine_config_from_args(parser.parse_args([])).model.quantization == "auto"
    with pytest.raises(SystemExit):
        parser.parse_args(["--quantization", "int3"])


@pytest.mark.parametrize("method", METHODS)
def test_engine_serves_a_quantized_model(tiny_dir, monkeypatch, tmp_path, method):
    """The Engine loads the tiny Llama with ``quantization=method`` (input scales searched once
    and cached), and its greedy output is deterministic."""
    from tests.helpers.models import make_engine

    monkeypatch.setenv("RADIXSERVE_CACHE", str(tmp_path))
    eng = make_engine(tiny_dir, dtype="bfloat16", quantization=method, max_total_tokens=512)
    assert eng.runner.numerics.quantization == method and eng.info.quantization == method
    layers = [m for m in eng.runner.model.modules() if isinstance(m, QuantLinear)]
    # 8 decoder linears, plus the int8 LM head of the weight-only methods (quantize_lm_head)
    assert len(layers) == 8 and all(m.method == method for m in layers)
    assert (eng.runner.model.lm_head_quant is not None) == (method != "w8a8" and cpu_native.load())
    assert list((tmp_path / "quant_scales").glob(f"*-{method}-v*.pt"))
    sp = {"max_new_tokens": 8, "temperature": 0}
    a = eng.generate(input_ids=[5, 17, 300, 42], sampling_params=sp)["output_ids"]
    b = eng.generate(input_ids=[5, 17, 300, 42], sampling_params=sp)["output_ids"]
    assert len(a) == 8 and a == b
    eng.check_invariants()


native = pytest.mark.skipif(not cpu_native.load(), reason="native CPU kernels did not build")


@native
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 9])
@pytest.mark.parametrize("n,k", [(96, 64), (61, 576), (8, 48)])  # K % 64 != 0 runs the fp32 product
def test_native_int8_linear_matches_the_dequantized_product(dtype, m, n, k):
    gen = torch.Generator().manual_seed(m * 1000 + n + k)
    w = torch.randn(n, k, generator=gen) * 0.05
    x = torch.randn(m, k, generator=gen)
    x[:, 3] = 40.0  # an outlier channel: its group's int16 scale is coarse, the rest are not
    q, scale = quantize_int8(w)
    y = torch.ops.radixserve_cpu.int8_linear(x.to(dtype), q, scale)
    assert y.dtype == dtype and y.shape == (m, n)
    xr, wd = x.to(dtype).float(), dequantize_int8(q, scale)
    ref = F.linear(xr, wd)
    # the int16 rounding of x (per group of 64 inputs, where K % 64 == 0) moves y by at most
    # sum over groups of (max|x| in the group / 32767 / 2) * sum |w| over the group
    groups = k // 64 if k % 64 == 0 else 0
    bound = torch.zeros(m, n)
    for g in range(groups):
        step = xr[:, 64 * g: 64 * (g + 1)].abs().amax(1, keepdim=True) / 32767 / 2
        bound += step * wd[:, 64 * g: 64 * (g + 1)].abs().sum(1)[None, :]
    slack = 1e-5 * float(ref.abs().max()) if dtype == torch.float32 else 8e-3 * ref.abs()  # output rounding
    assert bool(((y.float() - ref).abs() <= bound + slack + 1e-6).all())
    # one wrong weight must show: the check is tight enough to catch a kernel that skips a column
    q_bad = q.clone()
    q_bad[:, -1] = 0
    bad = torch.ops.radixserve_cpu.int8_linear(x.to(dtype), q_bad, scale)
    assert not bool(((bad.float() - ref).abs() <= bound + slack + 1e-6).all())


@native
def test_native_int8_linear_rejects_bad_shapes():
    q, scale = quantize_int8(torch.randn(16, 64))
    with pytest.raises(RuntimeError, match="K must match"):
        torch.ops.radixserve_cpu.int8_linear(torch.randn(2, 32), q, scale)
    with pytest.raises(RuntimeError, match="fp32 \\[N\\] scale"):
        torch.ops.radixserve_cpu.int8_linear(torch.randn(2, 64), q, scale[:8].contiguous())
    assert QuantLinear(W, None, "int8", torch.bfloat16).native
    with pytest.raises(RuntimeError, match="in_scale must be a contiguous fp32 \\[K\\]"):
        torch.ops.radixserve_cpu.int8_linear(torch.randn(2, 64), q, scale, torch.ones(32))


@native
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k", [64, 48])  # the int16 and the fp32 inner product
def test_native_int8_linear_applies_the_input_scale_in_fp32(dtype, k):
    """``in_scale`` multiplies x's columns in fp32 inside the kernel: the same as scaling an
    fp32 x beforehand, and not the same as ignoring it."""
    gen = torch.Generator().manual_seed(k)
    q, scale = quantize_int8(torch.randn(24, k, generator=gen))
    x = torch.randn(3, k, generator=gen).to(dtype)
    inv = torch.rand(k, generator=gen) * 4 + 0.1
    got = torch.ops.radixserve_cpu.int8_linear(x, q, scale, inv)
    want = torch.ops.radixserve_cpu.int8_linear(x.float() * inv, q, scale)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol * float(want.abs().max()))
    plain = torch.ops.radixserve_cpu.int8_linear(x, q, scale).float()
    assert (plain - want).abs().max() > 0.1 * want.abs().max()


def test_int8_without_the_native_library_uses_torchs_kernel(monkeypatch):
    x = torch.randn(3, 64).bfloat16()
    # the module quant.py holds: tests/kernels/test_kernels.py re-imports radixserve.kernels
    monkeypatch.setattr(quant.cpu_native, "load", lambda: False)
    layer = QuantLinear(W, B, "int8", torch.bfloat16)
    assert not layer.native
    ref = F.linear(x.float(), fake_quantize("int8", W), B)
    assert (layer(x).float() - ref).abs().max() <= 0.03 * ref.abs().max()


@native
def test_quantize_lm_head_for_weight_only_methods(tiny_dir):
    from radixserve.model import loader
    from radixserve.model.quant.head import dequantize_int8_grouped, quantize_int8_grouped, quantize_lm_head

    model = loader.load_model(loader.load_config(tiny_dir), tiny_dir, torch.float32, torch.device("cpu"), 64)
    assert not quantize_lm_head(model, "w8a8") and model.lm_head_quant is None
    # float32 activations keep float32 arithmetic: a random head is off the int8 grid, so it stays dense
    assert not quantize_lm_head(model, "int4") and model.lm_head_quant is None
    w = model.lm_head_weight()
    q, scale = quantize_int8_grouped(w.float())
    on_grid = dequantize_int8_grouped(q, scale.half().float())  # a Q8_0 embedding: fp16 scales
    with torch.no_grad():
        w.copy_(on_grid)
    assert quantize_lm_head(model, "int4") and model.lm_head_quant.exact
    assert torch.equal(model.lm_head_quant.dequantized(), on_grid)
    model.lm_head_quant = None
    model.act_dtype = torch.bfloat16  # the int8 head of the bf16 paths, on any weight
    assert quantize_lm_head(model, "int4")
    head = model.lm_head_quant
    assert not head.exact
    assert (head.out_features, head.in_features) == tuple(model.lm_head_weight().shape)
    x = torch.randn(3, head.in_features)
    w = model.lm_head_weight().float()
    q, scale = quantize_int8_grouped(w)
    assert torch.allclose(head.dequantized(), dequantize_int8_grouped(q, scale), rtol=1e-3, atol=1e-6)
    ref = F.linear(x, head.dequantized())
    assert torch.allclose(head(x), ref, atol=1e-3 * float(ref.abs().max()))


@native
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,k", [(1, 576), (5, 64), (2, 96)])  # K % 64 != 0 runs the fp32 product
def test_native_int8_linear_with_grouped_scales(dtype, m, k):
    from radixserve.model.quant.head import dequantize_int8_grouped, quantize_int8_grouped

    gen = torch.Generator().manual_seed(k + m)
    w = torch.randn(37, k, generator=gen) * torch.rand(1, k, generator=gen)  # scales differ by group
    x = torch.randn(m, k, generator=gen)
    q, scale = quantize_int8_grouped(w)
    y = torch.ops.radixserve_cpu.int8_linear(x.to(dtype), q, scale).float()
    ref = F.linear(x.to(dtype).float(), dequantize_int8_grouped(q, scale))
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-4  # int16 rounding of x (bounded above) and output rounding
    assert float((y - ref).abs().max()) <= tol * float(ref.abs().max())
    wrong = scale.clone()
    wrong[:, -1] *= 2  # one group's scale ignored or misapplied must show
    bad = torch.ops.radixserve_cpu.int8_linear(x.to(dtype), q, wrong).float()
    assert float((bad - ref).abs().max()) > tol * float(ref.abs().max())
    with pytest.raises(RuntimeError, match="K / 32"):
        torch.ops.radixserve_cpu.int8_linear(x.to(dtype), q, scale[:, :-1].contiguous())
