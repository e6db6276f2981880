"""The low-overhead decode paths (model/cpu/layer_loop.py, model/cpu/layer_stack.py and the fused
rotary + K/V store) compute exactly what the module path computes: same tokens, same logprobs
to the bit, fp32 and bf16, dense (plain and packed), int4 and int8 weights, over prefill, shared
prefixes and decode.  Whether dense weights are packed is pinned (``dense_kernel``), never left
to what this machine's timing picks: each test names the kernel it runs, or runs both."""
from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from tests.helpers.models import make_engine
from radixserve.kernels import cpu_native
from radixserve.model.cpu import layer_loop, layer_stack
from radixserve.model.quant import packed as packed_linear
from radixserve.model.quant.packed import PackedLinear
from radixserve.worker import model_runner
from radixserve.worker.tuning.numerics_choice import Numerics

pytestmark = pytest.mark.skipif(not cpu_native.load(), reason="no C++ compiler: the module path is the only one")

SHARED = list(range(300, 348))  # a 48-token prefix shared by two requests (the plan's shared-prefix task)
REAL_USABLE, REAL_RUN, REAL_STACK = layer_loop.usable, layer_loop.run_layers, layer_stack.run
# the last prompt makes a prefill step with a causal block for flash attention (>= 512 query rows
# per KV head over an fp32 pool): step_attention's general path
PROMPTS = [SHARED + [5, 6, 7], SHARED + [9, 10], list(range(1000, 1003)), list(range(2000, 2090)),
           list(range(3000, 3300))]
# the dense kernels, each on purpose: F.linear on nn.Linear, and oneDNN's prepacked PackedLinear
KERNELS = ["plain", pytest.param("packed", marks=pytest.mark.skipif(
    not packed_linear.available(torch.float32), reason="this torch build has no oneDNN packed linear"))]
DENSE_KIND = {"plain": (nn.Linear, layer_stack.DENSE), "packed": (PackedLinear, layer_stack.PACKED)}


def _stack_kinds(eng) -> set:
    """The layer_stack kinds of the model's decoder linears at one row."""
    cache = eng.runner.model.__dict__[layer_stack._CACHE]
    return {layer_stack.linear_spec(m, 1)[0] for m in cache.linears}


def _run(tiny_dir: str, dtype: str, mode: str, monkeypatch, inspect=None, **engine_kw) -> tuple[list, int, int]:
    """Generate PROMPTS with ``mode``: "stack" (layer_stack where it applies, else layer_loop),
    "loop" (layer_loop only), "fused" (module path with the fused rotary + store) or "modules"
    (the path before any of them: split, rope_, index_copy_).  Returns the outputs and how many
    steps ran through layer_loop and through the stack."""
    calls, stacked = [], []

    def stack(*a):
        out = REAL_STACK(*a)
        if out is not None:
            stacked.append(1)
        return out

    monkeypatch.setattr(layer_loop, "run_layers", lambda *a: calls.append(1) or REAL_RUN(*a))
    monkeypatch.setattr(layer_loop, "usable", REAL_USABLE if mode in ("loop", "stack") else (lambda *a: False))
    monkeypatch.setattr(layer_stack, "run", stack if mode == "stack" else (lambda *a: None))
    eng = make_engine(tiny_dir, dtype=dtype, max_total_tokens=4096, **engine_kw)
    try:
        if mode == "modules":
            eng.runner.backend.caller_stores_kv = None
            eng.runner.backend.packed_store = 0
        gen = torch.Generator().manual_seed(0)  # the tiny model's norms are all ones: make each layer's differ
        for name, p in eng.runner.model.named_parameters():
            if name.endswith("layernorm.weight"):
                p.data.mul_((torch.rand(p.shape, generator=gen) + 0.5).to(p.dtype))
        first = eng.generate(input_ids=PROMPTS[:1], sampling_params={"max_new_tokens": 1, "temperature": 0})
        outs = eng.generate(input_ids=PROMPTS, sampling_params={"max_new_tokens": 10, "temperature": 0},
                            return_logprob=True, logprob_start_len=0)
        eng.check_invariants()
        if inspect:
            inspect(eng)
    finally:
        eng.shutdown()
    keep = ("input_token_logprobs", "output_token_logprobs")
    outs = [first[0]["output_ids"]] + [(o["output_ids"], [o["meta_info"][k] for k in keep]) for o in outs]
    return outs, len(calls), len(stacked)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fast_paths_are_bit_identical_to_the_module_path(tiny_dir, dtype, kernel, monkeypatch):
    if kernel == "packed" and not packed_linear.available(getattr(torch, dtype)):
        pytest.skip(f"this CPU has no oneDNN {dtype} packing (bf16 needs AVX-512 or AVX-NE-CONVERT)")
    kinds: set = set()
    ref, ref_calls, _ = _run(tiny_dir, dtype, "modules", monkeypatch, dense_kernel=kernel)
    fused, fused_calls, _ = _run(tiny_dir, dtype, "fused", monkeypatch, dense_kernel=kernel)
    loop, loop_calls, _ = _run(tiny_dir, dtype, "loop", monkeypatch, dense_kernel=kernel)
    stack, stack_loop_calls, stacked = _run(tiny_dir, dtype, "stack", monkeypatch,
                                            lambda eng: kinds.update(_stack_kinds(eng)), dense_kernel=kernel)
    assert kinds == {DENSE_KIND[kernel][1]}, "the pinned dense kernel ran"
    assert ref_calls == fused_calls == 0 and loop_calls > 10, "each path ran where it should"
    assert stacked > 10 and stacked + stack_loop_calls == loop_calls, "the stack ran where it applies"
    assert fused == ref
    assert loop == ref
    assert stack == ref


@pytest.mark.parametrize("dtype,kind", [("float32", "int8"), ("bfloat16", "fp8_e4m3")])
def test_fast_paths_over_a_packed_pool(tiny_dir, dtype, kind, monkeypatch):
    """A quantized pool (``--kv-cache-dtype``): the loop and the stack stage the rotated K/V and
    pack them with ``store_kv_packed``, as the module path's ``store_kv`` does: the same bits."""
    kw = {"dense_kernel": "plain", "kv_cache_dtype": kind}
    ref, ref_calls, _ = _run(tiny_dir, dtype, "modules", monkeypatch, **kw)
    loop, loop_calls, _ = _run(tiny_dir, dtype, "loop", monkeypatch, **kw)
    stack, stack_loop_calls, stacked = _run(tiny_dir, dtype, "stack", monkeypatch, **kw)
    assert ref_calls == 0 and loop_calls > 10 and stacked > 10
    assert loop == ref
    assert stack == ref


@pytest.mark.parametrize("numerics", ["int4", "int8", "int4 at <= 8 rows, packed", "int4 at <= 8 rows, float32"])
def test_stack_runs_quantized_layers_bit_identically(tiny_dir, numerics, monkeypatch):
    """The stack's linear kinds: the blocked int4 kernel, the native int8 one, a hybrid as
    ``auto`` picks on the development machines: int4 up to 8 rows (the decode steps), oneDNN's
    packed bf16 weights above (the prefills); and int4 on float32 activations (the exact kernel)."""
    method = numerics.split()[0]  # int4 / int8
    dtype = torch.float32 if "float32" in numerics else torch.bfloat16
    n = Numerics(dtype, method, 8 if "rows" in numerics else None,
                 "packed" in numerics and packed_linear.available(torch.bfloat16))
    monkeypatch.setattr(model_runner, "resolve_numerics", lambda *a: n)
    kinds = set()

    def inspect(eng):
        cache = eng.runner.model.__dict__[layer_stack._CACHE]
        for regime, rows in enumerate([1] + [t + 1 for t in cache.thresholds]):
            assert cache.by_regime[regime] is not None, "a stack for every row regime the steps had"
            kinds.update(layer_stack.linear_spec(m, rows)[0] for m in cache.linears)

    name = str(dtype).removeprefix("torch.")
    loop, _, _ = _run(tiny_dir, name, "loop", monkeypatch)
    stack, loop_calls, stacked = _run(tiny_dir, name, "stack", monkeypatch, inspect)
    assert stacked > 10
    quantized = layer_stack.INT8 if method == "int8" else layer_stack.EXACT4 if dtype == torch.float32 \
        else layer_stack.BLOCKED4
    dense = layer_stack.PACKED if n.packed else layer_stack.DENSE
    assert kinds == ({quantized} if n.max_m is None else {quantized, dense})
    assert stack == loop


def test_usable_only_where_exact(tiny_dir):
    eng = make_engine(tiny_dir, max_total_tokens=1024, dense_kernel="plain")  # (either kernel: usable ignores it)
    try:
        model, backend = eng.runner.model, eng.runner.backend
        assert layer_loop.usable(model, backend, torch.float32)
        assert not layer_loop.usable(model, backend, torch.bfloat16), "the pool's dtype differs"
        backend.caller_stores_kv = None
        assert not layer_loop.usable(model, backend, torch.float32), "a backend that stores K/V itself"
    finally:
        eng.shutdown()


def _same_kind(old: nn.Module, weight: torch.Tensor) -> nn.Module:
    """A new module of ``old``'s kind (nn.Linear or PackedLinear, no bias) computing ``x @ weight.T``."""
    if type(old) is PackedLinear:  # (its weight cannot be read back: ``weight`` comes from the checkpoint)
        return PackedLinear(weight.to(old.weight_dtype), None)
    new = nn.Linear(old.in_features, old.out_features, bias=False, dtype=old.weight.dtype)
    new.weight.data.copy_(weight)
    return new


@pytest.mark.parametrize("kernel", KERNELS)
def test_stack_steps_aside_where_it_does_not_apply(tiny_dir, kernel):
    """run() returns None (layer_loop runs) for a hooked linear layer and for a step whose
    attention has flash-attention blocks; it rebuilds after a layer module is replaced by a new
    one of the same kind."""
    eng = make_engine(tiny_dir, max_total_tokens=1024, dense_kernel=kernel)
    try:
        model, backend = eng.runner.model, eng.runner.backend
        module_type, stack_kind = DENSE_KIND[kernel]
        assert type(model.layers[0].mlp.down_proj) is module_type, "the pinned dense kernel was loaded"
        seen = []
        real = layer_stack.run

        def spy(*a):
            out = real(*a)
            seen.append(out is not None)
            return out

        sp = {"max_new_tokens": 3, "temperature": 0}
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(layer_stack, "run", spy)
            want = eng.generate(input_ids=[[5, 6, 7, 8]], sampling_params=sp)[0]["output_ids"]
            assert seen == [True] * 3 and _stack_kinds(eng) == {stack_kind}
            handle = model.layers[1].mlp.down_proj.register_forward_hook(lambda *a: None)
            seen.clear()
            assert eng.generate(input_ids=[[5, 6, 7, 8]], sampling_params=sp)[0]["output_ids"] == want
            assert seen == [False] * 3, "a hooked layer runs through Python"
            handle.remove()
            weight = load_file(os.path.join(tiny_dir, "model.safetensors"))["model.layers.0.mlp.down_proj.weight"]
            model.layers[0].mlp.down_proj = _same_kind(model.layers[0].mlp.down_proj, weight)
            seen.clear()
            assert eng.generate(input_ids=[[5, 6, 7, 8]], sampling_params=sp)[0]["output_ids"] == want
            assert seen == [True] * 3
            assert model.__dict__[layer_stack._CACHE].linears[3] is model.layers[0].mlp.down_proj, "rebuilt"
            assert _stack_kinds(eng) == {stack_kind}
            backend.dense = type(backend.dense)(1, 1)  # every block with a query row to flash attention
            seen.clear()
            assert eng.generate(input_ids=[list(range(40, 80))], sampling_params={"max_new_tokens": 1})
            assert seen[0] is False, "a prefill with flash-attention blocks runs through Python"
        eng.check_invariants()
    finally:
        eng.shutdown()


# bf16 where a family brings its own bf16 rounding points (Qwen 3's q/k norms, Gemma 3's norms,
# GeGLU and rotaries); Phi's and Gemma 2's ops are those same ones
FAMILY_DTYPES = [("qwen3", "float32"), ("qwen3", "bfloat16"), ("gemma3", "float32"), ("gemma3", "bfloat16"),
                 ("phi3", "float32"), ("gemma2", "float32")]


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory, smol_dir) -> dict[str, str]:
    from tests.helpers.families import build_family

    dirs = {}
    for name in dict(FAMILY_DTYPES):
        dirs[name] = str(tmp_path_factory.mktemp(name))
        build_family(name, dirs[name], smol_dir)
    return dirs


@pytest.mark.parametrize("name,dtype", FAMILY_DTYPES)
def test_families_on_the_layer_loop_are_bit_identical(family_dirs, name, dtype, monkeypatch):
    """Qwen 3's q/k norms (``rms_norm_heads_`` on the fused projection), Phi-4-mini's partial
    rotary (a cos/sin table narrower than the head), Gemma's four norms, GeGLU, rotary per layer
    type, windows and soft-caps run in the fast paths exactly as the modules compute them."""
    ref, ref_calls, _ = _run(family_dirs[name], dtype, "modules", monkeypatch, dense_kernel="plain")
    loop, loop_calls, stacked = _run(family_dirs[name], dtype, "stack", monkeypatch, dense_kernel="plain")
    assert ref_calls == 0 and loop_calls + stacked > 10
    # the C++ stack runs them all: Phi's partial rotary (the stack's rope_store_kv too), the q/k
    # norms, Gemma's four norms, GeGLU, rotaries per layer type and per-layer windows and caps
    assert stacked > 10, (name, stacked)
    assert loop == ref


def test_sliding_window_layers_on_the_layer_loop_are_bit_identical(tmp_path, smol_dir, monkeypatch):
    """Mistral-style windows shorter than the prompts: the stack runs each layer over its window's
    plan (``native_layer_plans``)."""
    from tests.helpers.families import build_family

    build_family("mistral-window", str(tmp_path), smol_dir)
    ref, ref_calls, _ = _run(str(tmp_path), "float32", "modules", monkeypatch, dense_kernel="plain")
    loop, loop_calls, stacked = _run(str(tmp_path), "float32", "stack", monkeypatch, dense_kernel="plain")
    assert ref_calls == 0 and stacked > 10, (loop_calls, stacked)
    assert loop == ref
