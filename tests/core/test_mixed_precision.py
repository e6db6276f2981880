"""A bf16 model keeps its residual stream and its final hidden states in fp32: the LM head
(quantized, packed or plain) reads fp32 rows, and the logits stay close to the fp32 model's."""
from __future__ import annotations

import pytest
import torch

from radixserve.kernels import cpu_native
from radixserve.model import loader
from radixserve.model.quant import calibration, packed as packed_linear

SEQS = [[1, 5, 9, 200, 31, 7], [3, 4, 1000, 17]]


def _run(model, seen: list) -> torch.Tensor:
    """Teacher-forced fp32 logits of SEQS; ``seen`` gets the dtype the LM head was given."""
    logits = model.logits

    def spy(x):
        seen.append(x.dtype)
        return logits(x)

    model.logits = spy
    return calibration.teacher_forced_logits(model, SEQS)


@pytest.mark.parametrize("variant", ["plain", "packed", "int4"])
def test_bf16_models_feed_the_head_fp32_rows(tiny_dir, variant):
    if variant == "packed" and not packed_linear.available(torch.bfloat16):
        pytest.skip("this torch build has no oneDNN packed bf16 linear")
    if variant == "int4" and not cpu_native.load():
        pytest.skip("native CPU kernels did not build: no int8 LM head")
    config = loader.load_config(tiny_dir)
    cpu = torch.device("cpu")
    ref = _run(loader.load_model(config, tiny_dir, torch.float32, cpu, 32), seen := [])
    assert seen == [torch.float32]
    kw = {"packed": True} if variant == "packed" else {"quantization": "int4"} if variant == "int4" else {}
    model = loader.load_model(config, tiny_dir, torch.bfloat16, cpu, 32, **kw)
    got = _run(model, seen := [])
    assert seen == [torch.float32] and got.dtype == torch.float32 and got.shape == ref.shape
    if variant == "packed":
        assert model.lm_head_packed is not None
    if variant == "int4":
        assert model.lm_head_quant is not None
    tol = 0.1 if variant == "int4" else 0.05  # bf16 activations (and 4-bit weights) against fp32
    assert (got - ref).abs().max() <= tol * ref.abs().max()
