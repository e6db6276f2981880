"""Dense linear layers on oneDNN's prepacked weights (``radixserve/model/quant/packed.py``): the
same products as ``F.linear``, the model converted in place (decoder linears, a quantized
layer's dense fallback, the LM head), and greedy equality with HF through an Engine."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.helpers.models import hf_greedy, make_engine
from radixserve.model import loader
from radixserve.model.quant import calibration, packed as packed_linear
from radixserve.model.quant.packed import PackedLinear, pack_linears
from radixserve.model.quant.linear import QuantLinear
from radixserve.worker import model_runner
from radixserve.worker.tuning.numerics_choice import Numerics

pytestmark = pytest.mark.skipif(not packed_linear.available(torch.float32),
                                reason="this torch build has no oneDNN packed linear")
# oneDNN packs bf16 weights only on a CPU with AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT
NO_BF16 = pytest.mark.skipif(not packed_linear.available(torch.bfloat16),
                             reason="this CPU has no oneDNN bf16 packing (AVX2 only)")
DTYPES = [torch.float32, pytest.param(torch.bfloat16, marks=NO_BF16)]
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 3, 64, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_matches_f_linear(dtype, m, bias):
    g = torch.Generator().manual_seed(m)
    w = (torch.randn(96, 80, generator=g) * 0.1).to(dtype)
    b = torch.randn(96, generator=g).to(dtype) if bias else None
    x = torch.randn(m, 80, generator=g).to(dtype)
    layer = PackedLinear(w, b)
    want = F.linear(x.float(), w.float(), None if b is None else b.float())
    got = layer(x)
    assert got.dtype == dtype and got.shape == (m, 96)
    torch.testing.assert_close(got.float(), want, **TOL[dtype])
    # leading dimensions and a strided (non-contiguous) input
    x3 = torch.randn(2, m, 160, generator=g).to(dtype)[..., ::2]
    torch.testing.assert_close(layer(x3).float(), F.linear(x3.float(), w.float(), None if b is None else b.float()),
                               **TOL[dtype])


def test_a_wrong_weight_fails_the_comparison():
    """The comparison above can fail: a packed weight off by one output row does."""
    w = torch.randn(32, 16)
    x = torch.randn(4, 16)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(PackedLinear(w.roll(1, 0), None)(x), F.linear(x, w), **TOL[torch.float32])


def _load(tiny_dir: str, dtype: torch.dtype, packed: bool, **kw) -> nn.Module:
    return loader.load_model(loader.load_config(tiny_dir), tiny_dir, dtype, torch.device("cpu"), 64,
                             packed=packed, **kw)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_packed_model_computes_the_same_logits(tiny_dir, dtype):
    plain, packed = _load(tiny_dir, dtype, False), _load(tiny_dir, dtype, True)
    assert not any(type(m) is nn.Linear for m in packed.modules())
    assert sum(isinstance(m, PackedLinear) for m in packed.modules()) == 2 * 4 + 1  # 4 per layer + the head
    assert packed.lm_head_packed is not None and plain.lm_head_packed is None
    seqs = [[5, 17, 300, 42, 9], [7, 7, 1000]]
    torch.testing.assert_close(calibration.teacher_forced_logits(packed, seqs),
                               calibration.teacher_forced_logits(plain, seqs),
                               **(TOL[dtype] if dtype == torch.float32 else dict(rtol=0.05, atol=0.3)))


@NO_BF16
def test_a_quantized_layers_dense_fallback_is_packed(tiny_dir):
    model = _load(tiny_dir, torch.bfloat16, True, quantization="int8", max_m=2)
    layers = [m for m in model.modules() if isinstance(m, QuantLinear)]
    assert len(layers) == 8 and all(isinstance(m.dense, PackedLinear) for m in layers)
    assert model.lm_head_packed is not None  # the dense head for calls of more than 2 rows
    if model.lm_head_quant is not None:  # an int8 head for every call: no packed copy
        assert _load(tiny_dir, torch.bfloat16, True, quantization="int8").lm_head_packed is None
    ref = _load(tiny_dir, torch.bfloat16, False, quantization="int8", max_m=2)
    for m_rows in (2, 5):  # the int8 kernel at <= 2 rows, the packed dense weight above
        x = torch.randn(m_rows, 64).bfloat16()
        a, b = layers[0](x), [m for m in ref.modules() if isinstance(m, QuantLinear)][0](x)
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)


def test_pack_linears_leaves_other_modules_alone():
    model = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4, bias=False))
    x = torch.randn(3, 16)
    want = model(x)
    assert pack_linears(model) == 2
    assert isinstance(model[1], nn.ReLU) and all(isinstance(model[i], PackedLinear) for i in (0, 2))
    torch.testing.assert_close(model(x), want, **TOL[torch.float32])


def test_engine_with_packed_fp32_weights_is_greedy_equal_to_hf(tiny_dir, tiny_hf, monkeypatch):
    """fp32 is exact: the packed path changes only the GEMM's summation order."""
    monkeypatch.setattr(model_runner, "resolve_numerics", lambda *a, **k: Numerics(torch.float32, packed=True))
    eng = make_engine(tiny_dir, max_total_tokens=512)
    assert eng.runner.model.lm_head_packed is not None
    prompts = [[300, 301, 302, 303], [5, 17, 300, 42, 9, 9, 11]]
    outs = eng.generate(input_ids=prompts, sampling_params={"max_new_tokens": 12, "temperature": 0})
    assert [o["output_ids"] for o in outs] == [hf_greedy(tiny_hf, p, 12) for p in prompts]
    eng.check_invariants()
    eng.shutdown()
