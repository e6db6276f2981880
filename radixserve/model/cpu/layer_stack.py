"""Every decoder layer of a step in one native call (``kernels/cpu/layer_stack.cpp``).

``layer_loop.run_layers`` still makes ~270 op calls from Python per SmolLM2 step (nine per
layer, each ~1-3 us of argument parsing and dispatch, plus the loop itself); at batch 1 that
Python was ~1 ms of a ~9.5 ms decode step on the development machine.  A ``LayerStack`` holds
the model's per-layer weights as its linear layers will run them at this step's row count,
and its ``run`` makes the same op calls in C++: same ops, same order, same buffers, so the
results are bit-identical to ``run_layers``'s (tests/core/test_layer_loop.py).

It runs every layer ``run_layers`` runs (``DecoderLM.stackable``): Qwen 3's and Gemma 3's
per-head q/k norms (``set_qk_norms``: ``rms_norm_heads_`` before rotary), partial rotary,
GeGLU (``set_activation``: ``gelu_tanh_mul``), Gemma's four norms (``set_gemma_norms``), a
rotary per layer type (``set_rotaries``: each layer's index into the distinct rotaries' cos/sin
tables) and layers whose attention differs (sliding windows, soft-caps): the backend's
``native_layer_plans`` gives one group of kernel arguments per distinct layer attention (its
K/V store slots, request->slot table, plan, window and cap) and each layer's group, which the
stack takes once (``set_layer_groups``) and the groups on every ``run``.

``run(model, x, batch, backend, lora)`` returns ``run_layers``'s result, or None when the stack does
not apply (the caller then runs ``run_layers``): the native library lacks it, the backend's
attention is not one kernel call per layer this step (``native_layer_plans`` is None: a plan
with flash-attention blocks, a backend other than the CPU kernel's), a linear layer is of a
kind the stack does not run (w8a8, a bias on a quantized layer, a subclass) or has hooks, or
the layers differ in their attention scale, norm epsilon, activation or which norms they have.
A step with LoRA adapters runs in the stack when its ``LoRAStep`` takes the native segmented
kernel (``lora.sgmv``): the stack holds the slots' A/B tensors (``set_lora``, once per stack)
and this step's row groups (``set_lora_step``), and adds the deltas where ``run_layers`` calls
``LoRAStep.add``.

The stacks are cached on the model, one per linear-layer regime (a QuantLinear runs its dense
weights above ``max_m`` rows), and rebuilt when a layer's norm, linear or rotary module or a
norm weight is replaced; in-place changes to weights are seen as they are, but a module's
tensors must not be reassigned once it has run (the stack holds the tensors it was built with).
"""
from __future__ import annotations

import bisect
import operator
from typing import Any, Optional

import torch
from torch import nn

from radixserve.attention.base import AttentionBackend, ForwardBatch
from radixserve.kernels import cpu_native
from radixserve.model.quant.packed import PackedLinear
from radixserve.model.quant.linear import QuantLinear

INT8, PACKED, DENSE, BLOCKED4, EXACT4, BLOCKED8 = 1, 2, 3, 4, 5, 8  # the linear kinds of layer_stack.cpp
SILU, GELU_TANH = 0, 1  # its activations
_LINEARS = (("self_attn", "qkv_proj"), ("self_attn", "o_proj"), ("mlp", "gate_up_proj"), ("mlp", "down_proj"))
_CACHE = "_layer_stack_cache"
_WALKED = 17  # entries per layer in _walk's list


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
                return (EXACT4 if mod.exact else BLOCKED4), mod.q, mod.inv_scale, None
            return (INT8, mod.q, mod.scale, mod.inv_scale) if mod.method == "int8" else None
        if mod.dense is not None and mod.max_m is not None and rows > mod.max_m:
            return linear_spec(mod.dense, rows)
        return None
    if cls is PackedLinear:
        return PACKED, mod.packed, mod.bias, None
    return (DENSE, mod.weight, mod.bias, None) if cls is nn.Linear else None


def _walk(model: Any) -> list:
    """Per layer (``_WALKED`` entries): its norm modules (input, post-attention, Gemma's pre- and
    post-feedforward, q and k: None where it has none) and their weights, its four linear
    modules and its rotary (the identity of these decides whether a cached stack is still the
    model's)."""
    out: list = []
    for layer in model.layers:
        mods = layer._modules
        attn, mlp = mods["self_attn"]._modules, mods["mlp"]._modules
        n0, n1 = mods["input_layernorm"], mods["post_attention_layernorm"]
        n2, n3 = mods.get("pre_feedforward_layernorm"), mods.get("post_feedforward_layernorm")
        n4, n5 = attn.get("q_norm"), attn.get("k_norm")
        # (spelled out: a comprehension over the norms costs ~8 us a step at 30 layers)
        out += (n0, n1, n2, n3, n4, n5, n0._parameters["weight"], n1._parameters["weight"],
                None if n2 is None else n2._parameters["weight"], None if n3 is None else n3._parameters["weight"],
                None if n4 is None else n4._parameters["weight"], None if n5 is None else n5._parameters["weight"],
                attn["qkv_proj"], attn["o_proj"], mlp["gate_up_proj"], mlp["down_proj"], attn["rotary"])
    return out


class _Stacks:
    """The stacks of one model state: by regime (how many ``max_m`` thresholds a step exceeds)."""

    def __init__(self, model: Any, mods: list, pool: Any) -> None:
        self.mods, self.pool, self.k_buffer = mods, pool, pool.k_buffer
        per_layer = [mods[i: i + _WALKED] for i in range(0, len(mods), _WALKED)]
        present = {tuple(n is not None for n in p[2:6]) for p in per_layer}  # which optional norms a layer has
        pre_ff, post_ff, q_norm, k_norm = next(iter(present))  # (some layer's: not uniform when they differ)
        norms = [n for p in per_layer for n in p[0:4] if n is not None]
        qk_norms = [n for p in per_layer for n in p[4:6] if n is not None]
        self.norm_weights = [w for p in per_layer for w in p[6:8]]
        self.ff_norm_weights = [w for p in per_layer for w in p[8:10]] if pre_ff else []
        self.qk_norms = [w for p in per_layer for w in p[10:12]] if q_norm else []
        self.linears = [m for p in per_layer for m in p[12:16]]
        self.rotaries = list({id(p[16]): p[16] for p in per_layer}.values())  # distinct, in layer order
        self.rotary_index = [self.rotaries.index(p[16]) for p in per_layer]
        self.thresholds = sorted({m.max_m for m in self.linears if type(m) is QuantLinear and m.max_m is not None})
        attns = [layer.self_attn for layer in model.layers]
        acts = {layer.mlp.act == "silu" for layer in model.layers}
        self.act = SILU if acts == {True} else GELU_TANH
        # every layer alike: Gemma's norms and the q/k norms in all or none, one eps, scale, activation
        self.uniform = (len(present) == 1 and pre_ff == post_ff and q_norm == k_norm
                        and len({a.scaling for a in attns}) == 1 and len({n.eps for n in norms}) == 1
                        and len({n.eps for n in qk_norms}) <= 1 and len(acts) == 1
                        and [a.layer_id for a in attns] == list(range(len(attns))))
        self.scaling, self.eps, self.heads = attns[0].scaling, norms[0].eps, attns[0].num_heads
        self.qk_eps = qk_norms[0].eps if qk_norms else 0.0
        self.layer_groups: Optional[list[int]] = None  # the backend's, as the built stacks have it
        self.by_regime: dict[int, Any] = {}
        self.lora_of: dict[int, Any] = {}  # id(stack) -> the LoRA slots it holds

    def set_lora(self, stack: Any, slots: Any) -> None:
        """Give ``stack`` the LoRA slots' tensors (once per stack and slots object)."""
        if self.lora_of.get(id(stack)) is slots:
            return
        a, b, parts, cols = [], [], [], []
        for lid in range(len(self.linears) // len(_LINEARS)):
            for m in ("qkv", "o", "gate_up", "down"):
                a.append(slots.a.get((lid, m)))
                b.append(slots.b.get((lid, m)))
                parts.append(slots.parts(m))
                cols.append(slots.cols(m))
        stack.set_lora(a, b, parts, cols, slots.rank)
        self.lora_of[id(stack)] = slots

    def get(self, rows: int) -> Any:
        regime = bisect.bisect_left(self.thresholds, rows)
        if regime not in self.by_regime:
            self.by_regime[regime] = self._build(rows)
        return self.by_regime[regime]

    def set_layer_groups(self, index: list[int]) -> None:
        """Each layer's attention group (``AttentionBackend.native_layer_plans``), in every stack."""
        self.layer_groups = index
        for stack in self.by_regime.values():
            if stack is not None:
                stack.set_layer_groups(index)

    def _build(self, rows: int) -> Any:
        specs = [linear_spec(m, rows) for m in self.linears]
        if not self.uniform or any(s is None for s in specs):
            return None
        kinds, w, a, b = (list(t) for t in zip(*specs))
        stack = torch.classes.radixserve_cpu.LayerStack(self.norm_weights, kinds, w, a, b, self.pool.k_buffer,
                                                        self.pool.v_buffer, float(self.eps), int(self.heads))
        if self.qk_norms:
            stack.set_qk_norms(self.qk_norms, float(self.qk_eps))
        if self.ff_norm_weights:
            stack.set_gemma_norms(self.ff_norm_weights)
        stack.set_activation(self.act)
        stack.set_rotaries(self.rotary_index)
        if self.pool.quant:
            stack.set_kv_format(cpu_native.KV_FORMATS[self.pool.quant])
        if self.layer_groups is not None:
            stack.set_layer_groups(self.layer_groups)
        return stack


def available() -> bool:
    """Whether the loaded native library has the stack (call after ``cpu_native.load()``)."""
    try:
        return hasattr(torch.classes.radixserve_cpu, "LayerStack")
    except RuntimeError:  # no such namespace: the library is not loaded
        return False


def run(model: Any, x: torch.Tensor, batch: ForwardBatch, backend: AttentionBackend,
        lora: Any = None) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """``layer_loop.run_layers(model, x, batch, backend, lora=lora)`` in one native call, or None
    where the stack does not apply.  Call only where ``layer_loop.usable(model, backend, x.dtype)``;
    ``lora``: the step's ``LoRAStep`` or None."""
    if lora is not None and not lora.sgmv:
        return None
    if nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks:
        return None
    heads = model.layers[0].self_attn.num_heads
    plans = backend.native_layer_plans(batch, heads)
    if plans is None:
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
    groups, layer_groups = plans
    if layer_groups is not cache.layer_groups:
        cache.set_layer_groups(layer_groups)
    stack = cache.get(x.shape[0])
    if stack is None:
        return None
    locs, r2ts, tasks, entry_tok, tok_ptr, tok_entries, windows, caps = (list(t) for t in zip(*groups))
    cos = [r._buffers["cos"] for r in cache.rotaries]
    sin = [r._buffers["sin"] for r in cache.rotaries]
    if lora is not None:
        cache.set_lora(stack, lora.slots)
        stack.set_lora_step(lora.rows, lora.bounds, lora.seg_slots)
    try:
        return stack.run(x, batch.positions, cos, sin, locs, r2ts, tasks, entry_tok, tok_ptr, tok_entries, windows,
                         caps, cache.scaling)
    finally:
        if lora is not None:
            stack.clear_lora_step()
