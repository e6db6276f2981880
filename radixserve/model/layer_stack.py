"""Every decoder layer of a step in one native call (``kernels/cpu/layer_stack.cpp``).

``layer_loop.run_layers`` still makes ~270 op calls from Python per SmolLM2 step (nine per
layer, each ~1-3 us of argument parsing and dispatch, plus the loop itself); at batch 1 that
Python was ~1 ms of a ~9.5 ms decode step on the development machine.  A ``LayerStack`` holds
the model's per-layer weights as its linear layers will run them at this step's row count,
and its ``run`` makes the same op calls in C++: same ops, same order, same buffers, so the
results are bit-identical to ``run_layers``'s (tests/core/test_layer_loop.py).

Qwen 3's per-head q/k norms run in the stack too (``set_qk_norms``: ``rms_norm_heads_`` before
rotary, as the loop does).

``run(model, x, batch, backend)`` returns ``run_layers``'s result, or None when the stack does
not apply (the caller then runs ``run_layers``): the native library lacks it, the backend's
attention is not one kernel call per layer this step (``AttentionBackend.native_plan``), a
linear layer is of a kind the stack does not run (w8a8, a bias on a quantized layer, a
subclass) or has hooks, or the layers differ in their attention scale or norm epsilon.

The stacks are cached on the model, one per linear-layer regime (a QuantLinear runs its dense
weights above ``max_m`` rows), and rebuilt when a layer module or norm weight is replaced;
in-place changes to weights are seen as they are, but a module's tensors must not be
reassigned once it has run (the stack holds the tensors it was built with).
"""
from __future__ import annotations

import bisect
import operator
from typing import Any, Optional

import torch
from torch import nn

from radixserve.attention.base import AttentionBackend, ForwardBatch
from radixserve.model.packed_linear import PackedLinear
from radixserve.model.quant import QuantLinear

INT8, PACKED, DENSE, BLOCKED4, BLOCKED8 = 1, 2, 3, 4, 8  # the linear kinds of layer_stack.cpp
_LINEARS = (("self_attn", "qkv_proj"), ("self_attn", "o_proj"), ("mlp", "gate_up_proj"), ("mlp", "down_proj"))
_CACHE = "_layer_stack_cache"
_WALKED = 8  # entries per layer in _walk's list


def _hooked(mod: nn.Module) -> bool:
    return bool(mod._forward_hooks or mod._forward_pre_hooks)


def linear_spec(mod: nn.Module, rows: int) -> Optional[tuple]:
    """``(kind, w, a, b)`` of the op that ``mod(x)`` runs for a 2-D ``x`` of ``rows`` rows, or None
    when the stack cannot run it."""
    if _hooked(mod):
        return None
    cls = type(mod)
    if cls is QuantLinear:
        if mod.native and mod.bias is None and (mod.max_m is None or rows <= mod.max_m):
            if mod.method == "int4":
                return BLOCKED4, mod.q, mod.inv_scale, None
            return (INT8, mod.q, mod.scale, mod.inv_scale) if mod.method == "int8" else None
        if mod.dense is not None and mod.max_m is not None and rows > mod.max_m:
            return linear_spec(mod.dense, rows)
        return None
    if cls is PackedLinear:
        return PACKED, mod.packed, mod.bias, None
    return (DENSE, mod.weight, mod.bias, None) if cls is nn.Linear else None


def _walk(model: Any) -> list:
    """Per layer (``_WALKED`` entries): its two norm modules, their weights and its four linear
    modules (the identity of these decides whether a cached stack is still the model's)."""
    out: list = []
    for layer in model.layers:
        mods = layer._modules
        norm_in, norm_post = mods["input_layernorm"], mods["post_attention_layernorm"]
        attn, mlp = mods["self_attn"]._modules, mods["mlp"]._modules
        out += (norm_in, norm_post, norm_in._parameters["weight"], norm_post._parameters["weight"],
                attn["qkv_proj"], attn["o_proj"], mlp["gate_up_proj"], mlp["down_proj"])
    return out


class _Stacks:
    """The stacks of one model state: by regime (how many ``max_m`` thresholds a step exceeds)."""

    def __init__(self, model: Any, mods: list, pool: Any) -> None:
        self.mods, self.pool, self.k_buffer = mods, pool, pool.k_buffer
        per_layer = [mods[i: i + _WALKED] for i in range(0, len(mods), _WALKED)]
        norms = [m for p in per_layer for m in p[0:2]]
        self.norm_weights = [w for p in per_layer for w in p[2:4]]
        self.linears = [m for p in per_layer for m in p[4:]]
        self.thresholds = sorted({m.max_m for m in self.linears if type(m) is QuantLinear and m.max_m is not None})
        attns = [layer.self_attn for layer in model.layers]
        q_norms = [a.q_norm for a in attns if a.q_norm is not None]  # Qwen 3: in every layer or none
        self.qk_norms = [w for a in attns if a.q_norm is not None for w in (a.q_norm.weight, a.k_norm.weight)]
        self.qk_eps = q_norms[0].eps if q_norms else 0.0
        self.uniform = (len({a.scaling for a in attns}) == 1 and len({n.eps for n in norms}) == 1
                        and [a.layer_id for a in attns] == list(range(len(attns)))
                        and len(q_norms) in (0, len(attns)) and len({n.eps for n in q_norms}) <= 1)
        self.scaling, self.eps, self.heads = attns[0].scaling, norms[0].eps, attns[0].num_heads
        self.by_regime: dict[int, Any] = {}

    def get(self, rows: int) -> Any:
        regime = bisect.bisect_left(self.thresholds, rows)
        if regime not in self.by_regime:
            self.by_regime[regime] = self._build(rows)
        return self.by_regime[regime]

    def _build(self, rows: int) -> Any:
        specs = [linear_spec(m, rows) for m in self.linears]
        if not self.uniform or any(s is None for s in specs):
            return None
        kinds, w, a, b = (list(t) for t in zip(*specs))
        stack = torch.classes.radixserve_cpu.LayerStack(self.norm_weights, kinds, w, a, b, self.pool.k_buffer,
                                                        self.pool.v_buffer, float(self.eps), int(self.heads))
        if self.qk_norms:
            stack.set_qk_norms(self.qk_norms, float(self.qk_eps))
        return stack


def available() -> bool:
    """Whether the loaded native library has the stack (call after ``cpu_native.load()``)."""
    try:
        return hasattr(torch.classes.radixserve_cpu, "LayerStack")
    except RuntimeError:  # no such namespace: the library is not loaded
        return False


def run(model: Any, x: torch.Tensor, batch: ForwardBatch,
        backend: AttentionBackend) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """``layer_loop.run_layers(model, x, batch, backend)`` in one native call, or None where the
    stack does not apply.  Call only where ``layer_loop.usable(model, backend, x.dtype)``."""
    if nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks:
        return None
    heads = model.layers[0].self_attn.num_heads
    native = backend.native_plan(batch, heads)
    if native is None:
        return None
    mods = _walk(model)
    cache: Optional[_Stacks] = model.__dict__.get(_CACHE)
    if (cache is None or len(cache.mods) != len(mods) or not all(map(operator.is_, cache.mods, mods))
            or cache.pool is not backend.kv_pool or cache.k_buffer is not backend.kv_pool.k_buffer):
        if not available():
            return None
        cache = model.__dict__[_CACHE] = _Stacks(model, mods, backend.kv_pool)
    if any(map(_hooked, cache.linears)):
        return None
    stack = cache.get(x.shape[0])
    if stack is None:
        return None
    rotary = model.rotary
    r2t, tasks, entry_tok, tok_ptr, tok_entries = native
    return stack.run(x, batch.positions, rotary.cos, rotary.sin, batch.out_cache_loc, r2t, tasks, entry_tok, tok_ptr,
                     tok_entries, cache.scaling)
