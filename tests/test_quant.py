"""Quantized linear layers (radixserve/model/quant.py), their calibration (model/calibration.py),
and the ``quantization`` option of ModelConfig, the CLI and the Engine.  Correctness only."""
from __future__ import annotations

import argparse

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from radixserve import cli
from radixserve.config import EngineConfig, ModelConfig
from radixserve.model import calibration, quant
from radixserve.model.quant import (METHODS, QuantLinear, dequantize_int4, dequantize_int8, fake_quantize,
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
    assert (y.float() - ref).abs().max() <= tol * ref.abs().max()


def test_w8a8_without_onednn_uses_int_mm(monkeypatch):
    x = torch.randn(7, 64).bfloat16()
    want = QuantLinear(W, B, "w8a8", torch.bfloat16)(x)
    monkeypatch.setattr(quant, "_onednn", lambda: False)
    layer = QuantLinear(W, B, "w8a8", torch.bfloat16)
    assert not layer.use_onednn and layer.q.dtype == torch.int8
    assert torch.allclose(layer(x).float(), want.float(), atol=1e-2, rtol=1e-2)


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
    from conftest import make_engine

    monkeypatch.setenv("RADIXSERVE_CACHE", str(tmp_path))
    eng = make_engine(tiny_dir, dtype="bfloat16", quantization=method, max_total_tokens=512)
    assert eng.runner.numerics.quantization == method and eng.info.quantization == method
    layers = [m for m in eng.runner.model.modules() if isinstance(m, QuantLinear)]
    assert len(layers) == 8 and all(m.method == method for m in layers)
    assert list((tmp_path / "quant_scales").glob(f"*-{method}-v*.pt"))
    sp = {"max_new_tokens": 8, "temperature": 0}
    a = eng.generate(input_ids=[5, 17, 300, 42], sampling_params=sp)["output_ids"]
    b = eng.generate(input_ids=[5, 17, 300, 42], sampling_params=sp)["output_ids"]
    assert len(a) == 8 and a == b
    eng.check_invariants()
