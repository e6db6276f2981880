"""The low-overhead decode path (model/layer_loop.py and the fused rotary + K/V store) computes
exactly what the module path computes: same tokens, same logprobs to the bit, fp32 and bf16,
over prefill, shared prefixes and decode."""
from __future__ import annotations

import pytest
import torch

from conftest import make_engine
from radixserve.kernels import cpu_native
from radixserve.model import layer_loop

pytestmark = pytest.mark.skipif(not cpu_native.load(), reason="no C++ compiler: the module path is the only one")

SHARED = list(range(300, 348))  # a 48-token prefix shared by two requests (the plan's shared-prefix task)
REAL_USABLE, REAL_RUN = layer_loop.usable, layer_loop.run_layers
# the last prompt makes a prefill step with a causal block for flash attention (>= 512 query rows
# per KV head over an fp32 pool): step_attention's general path
PROMPTS = [SHARED + [5, 6, 7], SHARED + [9, 10], list(range(1000, 1003)), list(range(2000, 2090)),
           list(range(3000, 3300))]


def _run(tiny_dir: str, dtype: str, mode: str, monkeypatch) -> tuple[list, int]:
    """Generate PROMPTS with ``mode``: "loop" (layer_loop), "fused" (module path with the fused
    rotary + store) or "modules" (the path before either: split, rope_, index_copy_)."""
    calls = []
    monkeypatch.setattr(layer_loop, "run_layers", lambda *a: calls.append(1) or REAL_RUN(*a))
    monkeypatch.setattr(layer_loop, "usable", REAL_USABLE if mode == "loop" else (lambda *a: False))
    eng = make_engine(tiny_dir, dtype=dtype, max_total_tokens=4096)
    try:
        if mode == "modules":
            eng.runner.backend.caller_stores_kv = None
        first = eng.generate(input_ids=PROMPTS[:1], sampling_params={"max_new_tokens": 1, "temperature": 0})
        outs = eng.generate(input_ids=PROMPTS, sampling_params={"max_new_tokens": 10, "temperature": 0},
                            return_logprob=True, logprob_start_len=0)
        eng.check_invariants()
    finally:
        eng.shutdown()
    keep = ("input_token_logprobs", "output_token_logprobs")
    return [first[0]["output_ids"]] + [(o["output_ids"], [o["meta_info"][k] for k in keep]) for o in outs], len(calls)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fast_paths_are_bit_identical_to_the_module_path(tiny_dir, dtype, monkeypatch):
    ref, ref_calls = _run(tiny_dir, dtype, "modules", monkeypatch)
    fused, fused_calls = _run(tiny_dir, dtype, "fused", monkeypatch)
    loop, loop_calls = _run(tiny_dir, dtype, "loop", monkeypatch)
    assert ref_calls == fused_calls == 0 and loop_calls > 10, "each path ran where it should"
    assert fused == ref
    assert loop == ref


def test_usable_only_where_exact(tiny_dir):
    eng = make_engine(tiny_dir, max_total_tokens=1024)
    try:
        model, backend = eng.runner.model, eng.runner.backend
        assert layer_loop.usable(model, backend, torch.float32)
        assert not layer_loop.usable(model, backend, torch.bfloat16), "the pool's dtype differs"
        backend.caller_stores_kv = None
        assert not layer_loop.usable(model, backend, torch.float32), "a backend that stores K/V itself"
    finally:
        eng.shutdown()
