"""The decoder layers of a step as one flat loop over the native CPU ops.

A decode step of a small model is bound by Python, not by arithmetic: walking the module tree
(``DecoderLayer`` -> ``RMSNorm`` -> ops class -> ``torch.ops`` packet, ``nn.Module.__getattr__``
for every submodule and parameter) cost about 0.7 ms of a 5.4 ms batch-1 step of SmolLM2 on the
development machine.  ``run_layers`` runs the same ops in the same order with the weights read
straight from the modules' own dicts, so its results are bit-identical to ``DecoderLayer.forward``'s.
The modules are read on every call (about a microsecond per layer), so layers replaced after
loading (quantization, packing, tests) are always the ones that run; the linear layers keep
``nn.Module.__call__``, so forward hooks on them (calibration) still fire.

Per layer that is seven calls (more with Qwen 3's q/k norms or Gemma's extra norms): two fused
norms, ``rope_store_kv`` (rotary on q and k, K/V into the pool), the backend's per-step
attention (``AttentionBackend.step_attention``: the plan and an output buffer bound once per
step), and the four linear layers with ``silu_mul``.

It applies when ``usable`` says so: Llama's layers (``DecoderLM.native_layers``: RMS q/k norms
or none, SwiGLU or GeGLU, a rotary per layer, Gemma's four norms; per-layer sliding windows and
soft-caps are the backend's ``step_attention``'s business), one rank (no all-reduce), the
native CPU ops (``NativeCpuOps``, with the fused ``rope_store_kv``), and an attention backend
that takes K/V written by the caller in the activations' dtype
(``AttentionBackend.caller_stores_kv``).
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from radixserve.attention.base import AttentionBackend, ForwardBatch


def usable(model: Any, backend: AttentionBackend, dtype: torch.dtype) -> bool:
    """True when ``run_layers`` computes exactly what the module path would for ``model``."""
    stores = backend.caller_stores_kv == dtype or (backend.packed_store and backend.kv_pool.dtype == dtype)
    return (model.layout.size == 1 and model.rotary.fused and stores
            and len(model.layers) > 0 and model.native_layers)


def run_layers(model: Any, x: torch.Tensor, batch: ForwardBatch, backend: AttentionBackend,
               residual: Optional[torch.Tensor] = None, lora: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """All decoder layers of ``model`` over the embeddings ``x [T, hidden]`` (or, with
    ``residual``, a previous pipeline stage's last MLP output and residual stream), writing each
    layer's K/V into ``backend.kv_pool``; returns (last MLP output, residual stream before it),
    as the loop over ``DecoderLayer.forward`` does.  Only when ``usable(model, backend, x.dtype)``.
    ``lora``: the step's ``LoRAStep`` (worker/lora/), whose deltas join the four linear layers'
    outputs, or None."""
    ops = torch.ops.radixserve_cpu
    rms, add_rms = ops.rms_norm.default, ops.add_rms_norm.default
    rope_store, silu_mul, norm_heads = ops.rope_store_kv.default, ops.silu_mul.default, ops.rms_norm_heads_.default
    pool = backend.kv_pool
    k_bufs, v_bufs = pool.k_buffer, pool.v_buffer
    positions = batch.positions
    tokens = x.shape[0]
    first = model.layers[0].self_attn
    packed = backend.packed_store
    if packed:  # rotary writes this step's K/V into staging rows; store_kv_packed packs them
        k_stage = x.new_empty(tokens, first.num_kv_heads, first.head_dim)
        v_stage, stage_loc, store = torch.empty_like(k_stage), torch.arange(tokens), ops.store_kv_packed.default
    q = x.new_empty(tokens, first.num_heads, first.head_dim)  # one rotated-q buffer for every layer
    attend = backend.step_attention(batch, first.num_heads)
    for layer in model.layers:
        mods = layer._modules  # direct dict reads: Module.__getattr__ costs ~0.3 us a lookup
        attn, mlp = mods["self_attn"], mods["mlp"]
        norm_in, norm_post = mods["input_layernorm"], mods["post_attention_layernorm"]
        a_mods, m_mods = attn._modules, mlp._modules
        if residual is None:
            residual, x = x.float(), rms(x.contiguous(), norm_in._parameters["weight"], norm_in.eps)
        else:
            add_rms(x, residual, norm_in._parameters["weight"], norm_in.eps)
        lid = attn.layer_id
        qkv = a_mods["qkv_proj"](x)
        if lora is not None:
            lora.add(lid, "qkv", x, qkv)
        q_norm = a_mods.get("q_norm")
        if q_norm is not None:  # Qwen 3
            qkv = qkv.contiguous()
            norm_heads(qkv, q_norm._parameters["weight"], a_mods["k_norm"]._parameters["weight"], attn.num_heads,
                       attn.num_kv_heads, q_norm.eps)
        rotary = a_mods["rotary"]  # (Gemma 3: one per layer type)
        loc = batch.layer_slots(pool, lid)[0]  # (a sliding layer of a hybrid pool: its own slots)
        if packed:
            rope_store(qkv, positions, rotary.cos, rotary.sin, k_stage, v_stage, stage_loc, q)
            store(k_stage, v_stage, loc, k_bufs[lid], v_bufs[lid], packed)
        else:
            rope_store(qkv, positions, rotary.cos, rotary.sin, k_bufs[lid], v_bufs[lid], loc, q)
        out = attend(q, lid, attn.scaling).view(tokens, attn.q_size)
        x = a_mods["o_proj"](out)
        if lora is not None:
            lora.add(lid, "o", out, x)
        x = x.contiguous()
        pre_ff = mods.get("pre_feedforward_layernorm")
        if pre_ff is None:
            add_rms(x, residual, norm_post._parameters["weight"], norm_post.eps)
        else:  # Gemma: the attention output is normed before it joins the stream
            x = rms(x, norm_post._parameters["weight"], norm_post.eps)
            add_rms(x, residual, pre_ff._parameters["weight"], pre_ff.eps)
        gate_up = m_mods["gate_up_proj"](x).contiguous()
        if lora is not None:
            lora.add(lid, "gate_up", x, gate_up)
        h = silu_mul(gate_up) if mlp.act == "silu" else mlp.act_mul(gate_up)
        x = m_mods["down_proj"](h).contiguous()
        if lora is not None:
            lora.add(lid, "down", h, x)
        if pre_ff is not None:
            post_ff = mods["post_feedforward_layernorm"]
            x = rms(x, post_ff._parameters["weight"], post_ff.eps)
    return x, residual
