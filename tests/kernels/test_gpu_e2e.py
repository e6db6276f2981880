"""End-to-end generation on CUDA (skipped without it): greedy equality with HF transformers
for every attention backend available there.  Run in its own pytest process on GPU
machines (tests/kernels/test_kernels.py sets TRITON_INTERPRET for its whole process)."""
from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from tests.helpers.models import hf_greedy, make_engine

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="TRITON_INTERPRET is set in this process"),
]


def _backends() -> list[str]:
    names = ["torch_native"]
    if importlib.util.find_spec("triton"):
        names.append("triton")
    if importlib.util.find_spec("flashinfer"):
        names.append("flashinfer")
    return names


@pytest.mark.parametrize("backend", _backends())
def test_tiny_greedy_on_cuda(tiny_dir, tiny_hf, backend):
    dtype = "bfloat16" if backend == "flashinfer" else "float32"  # flashinfer has no fp32 kernels
    eng = make_engine(tiny_dir, device="cuda", dtype=dtype, attention_backend=backend, chunked_prefill_size=16)
    prompts = [list(range(100, 100 + n)) for n in (1, 7, 40, 90)]
    eng.generate(input_ids=prompts[3][:50], sampling_params={"max_new_tokens": 0})
    outs = eng.generate(input_ids=prompts, sampling_params={"max_new_tokens": 16, "temperature": 0})
    if dtype == "float32":
        for p, o in zip(prompts, outs):
            assert o["output_ids"] == hf_greedy(tiny_hf, p, 16)
    assert outs[3]["meta_info"]["cached_tokens"] >= 49
    eng.check_invariants()


def test_smollm2_greedy_on_cuda(smol_dir):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(smol_dir, dtype=torch.float32).eval()
    eng = make_engine(smol_dir, device="cuda", max_total_tokens=20000)
    texts = ["The capital of France is", "def fibonacci(n):", "Photosynthesis is the process by which plants",
             "Once upon a time"]
    prompts = [eng.tokenizer.encode(t) for t in texts]
    outs = eng.generate(input_ids=prompts, sampling_params={"max_new_tokens": 64, "temperature": 0})
    for p, o in zip(prompts, outs):
        assert o["output_ids"] == hf_greedy(hf, p, 64)
