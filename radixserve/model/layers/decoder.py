"""The decoder-only causal LM every architecture is built from, over the paged KV pool.

Written against ``ForwardBatch``: tokens of all requests are packed in one dimension and
attention goes through an ``AttentionBackend``.  Weight names follow Hugging Face's so that
checkpoints load directly (q/k/v and gate/up are fused at load time).

An architecture (one file per family in ``arch/``, registered with ``registry.register`` by the config's
``model_type``) subclasses ``DecoderLM`` and overrides only what differs from Llama:

* ``make_layer(i)``: the decoder layer (``DecoderLayer``: pre-norm attention and MLP);
* ``attention_kwargs(i)``: q/k norms, biases, the attention scale of layer ``i``;
* ``make_norm(dim)``: the norm kind (Gemma's ``1 + w`` is folded into the weight at load);
* ``embed_scale``, ``final_logit_softcap``: Gemma's embedding scale and logit capping;
* ``layer_attention()``: each layer's sliding window / soft-capping (``LayerAttention``);
* ``checkpoint_tensors(name, t)``: renames or splits a checkpoint tensor before loading;
* ``unsupported(config)``: names of config features the file does not build (load refuses);
* ``kv_cache_shape()``: the KV pool's heads, head width and shared K/V (multi-head latent attention).

Tensor parallelism: built with a ``TPLayout`` and a group (``parallel/``), a rank holds its
query/KV heads, MLP columns and vocabulary shard (sliced at load time); o_proj and down_proj
outputs are all-reduced and the logits gathered on rank 0 (None on the other ranks).  With
the default ``NoTP`` group the collectives are identities and the layers are the full ones.

Pipeline parallelism: with a group whose ``pipe`` is set (``parallel/p2p.py``), the model is
one stage (``self.stage``, ``parallel/stage.py``): it builds only its layers (global layer ids
kept), the embedding on the first stage and the final norm and LM head on the last;
``final_hidden`` takes the previous stage's hidden states instead of embedding and hands its
own to the next stage (returning None) unless it is the last.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import nn

from radixserve.attention.base import AttentionBackend, ForwardBatch, LayerAttention
from radixserve.model.cpu import layer_loop, layer_stack
from radixserve.model.cpu.fused_ops import TorchOps
from radixserve.model.layers.norm_mlp import GatedMLP, RMSNorm, activation
from radixserve.model.layers.lm_head import LMHeadMixin
from radixserve.model.layers.rotary import RotaryEmbedding, build_rotary
from radixserve.model.layers.tp import VocabParallelEmbedding
from radixserve.model.layers.weights import WeightLoaderMixin
from radixserve.parallel.group import NoTP
from radixserve.parallel.layout import TPLayout
from radixserve.parallel.stage import PipeStage


class Attention(nn.Module):
    """Self-attention with fused q/k/v; ``q_norm``/``k_norm``: per-head RMSNorms (their weight
    and eps) applied before rotary (Qwen 3, Gemma 3), in place on the fused projection by
    ``ops.rms_norm_heads_``; ``scaling``: the softmax scale (default ``head_dim ** -0.5``)."""

    def __init__(self, config: Any, layer_id: int, rotary: RotaryEmbedding, layout: TPLayout, tp: Any,
                 bias: bool = False, qk_norm: Optional[Callable[[int], nn.Module]] = None,
                 scaling: Optional[float] = None) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.num_heads = layout.num_heads  # this rank's heads (all of them without TP)
        self.num_kv_heads = layout.num_kv_heads
        self.head_dim = layout.head_dim
        self.tp = tp
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scaling = scaling if scaling is not None else self.head_dim ** -0.5
        self.qkv_proj = nn.Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=bias)
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=False)
        self.rotary = rotary
        self.q_norm = qk_norm(self.head_dim) if qk_norm else None
        self.k_norm = qk_norm(self.head_dim) if qk_norm else None

    @property
    def plain(self) -> bool:
        """True when the native layer loops compute this attention: Llama's, or with q/k norms
        (one in-place op on the fused projection)."""
        return self.rotary.fused

    lora: Any = None  # a LoRAHolder when adapters are served (worker/lora/)

    def forward(self, x: torch.Tensor, batch: ForwardBatch, backend: AttentionBackend) -> torch.Tensor:
        qkv = self.qkv_proj(x)
        lora = self.lora.step if self.lora is not None else None
        if lora is not None:
            lora.add(self.layer_id, "qkv", x, qkv)
        if self.q_norm is not None:  # per head, in place on the fused projection
            qkv = qkv.contiguous()
            self.rotary.ops.rms_norm_heads_(qkv, self.q_norm.weight, self.k_norm.weight, self.num_heads,
                                            self.num_kv_heads, self.q_norm.eps)
        if self.plain and qkv.dtype == backend.caller_stores_kv:
            # one native pass: rotary on q (into a contiguous q) and k, K/V into the pool slots
            pool, lid = backend.kv_pool, self.layer_id
            q = self.rotary.rope_store_kv(qkv, batch.positions, pool.k_buffer[lid], pool.v_buffer[lid],
                                          batch.layer_slots(pool, lid)[0],
                                          qkv.new_empty(qkv.shape[0], self.num_heads, self.head_dim))
            out = backend.attend(q, None, None, lid, self.scaling, batch)
            return self.tp.all_reduce(self._out(out.view(-1, self.q_size), lora))
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        self.rotary.forward(batch.positions, q, k)
        out = backend.forward(q, k, v, self.layer_id, self.scaling, batch)
        return self.tp.all_reduce(self._out(out.reshape(-1, self.q_size), lora))

    def _out(self, out: torch.Tensor, lora: Any) -> torch.Tensor:
        y = self.o_proj(out)
        return y if lora is None else lora.add(self.layer_id, "o", out, y)


class DecoderLayer(nn.Module):
    """Llama's pre-norm layer: ``h = x + attn(norm(x)); out = h + mlp(norm(h))``."""

    def __init__(self, model: "DecoderLM", layer_id: int) -> None:
        super().__init__()
        config = model.config
        self.input_layernorm = model.make_norm(config.hidden_size)
        self.self_attn = Attention(config, layer_id, model.layer_rotary(layer_id), model.layout, model.tp,
                                   **model.attention_kwargs(layer_id))
        self.post_attention_layernorm = model.make_norm(config.hidden_size)
        self.mlp = GatedMLP(config.hidden_size, model.layout.intermediate, bool(getattr(config, "mlp_bias", False)),
                            model.ops, model.tp, activation(config))

    flat_loop = True  # layer_loop runs layers of this very class (a subclass it runs says so again)

    @property
    def plain(self) -> bool:
        """True when ``layer_loop`` runs this layer exactly: Llama's (q/k norms and the GeGLU
        activation allowed), or a subclass that sets ``flat_loop`` itself (Gemma's four norms)."""
        return (bool(type(self).__dict__.get("flat_loop")) and self.self_attn.plain and type(self.mlp) is GatedMLP
                and type(self.input_layernorm) is RMSNorm)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, batch: ForwardBatch,
                backend: AttentionBackend) -> tuple[torch.Tensor, torch.Tensor]:
        """``x`` is the previous layer's MLP output (the embeddings for the first layer, with
        ``residual`` None); returns this layer's MLP output and the residual stream before it.
        The residual stream is fp32 whatever the model's dtype, as llama.cpp keeps it: a few kB
        per token (SmolLM2-135M, int4 weights: teacher-forced argmax agreement with fp32 97.4%
        with a bf16 stream, 98.0% with an fp32 one, before the fp32 final hidden states)."""
        if residual is None:
            residual, x = x.float(), self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm.add_forward(x, residual)
        x, residual = self.post_attention_layernorm.add_forward(self.self_attn.forward(x, batch, backend), residual)
        return self.mlp.forward(x), residual


class DecoderLM(LMHeadMixin, WeightLoaderMixin, nn.Module):
    """``forward`` returns fp32 logits only for the rows in ``logit_rows`` (by default the
    last new token of each request), so the LM head never runs over a whole prompt unless
    prompt logprobs are asked for."""

    embed_scale: Optional[float] = None  # embeddings are multiplied by this (Gemma: sqrt(hidden))
    final_logit_softcap: Optional[float] = None  # logits -> cap * tanh(logits / cap)
    tp_unsupported: Optional[str] = None  # what stops tensor parallelism (the refusal names it)
    lora: Any = None  # a LoRAHolder when adapters are served (worker/lora/)
    act_dtype: torch.dtype = torch.float32  # the activations' dtype (set by loader.load_model)

    def __init__(self, config: Any, max_positions: int, ops: type[TorchOps] = TorchOps, tp: Any = None,
                 layout: Optional[TPLayout] = None) -> None:
        super().__init__()
        self.config = config
        self.ops = ops
        self.max_positions = max_positions
        self.tp = tp or NoTP()
        self.layout = layout or TPLayout.of(config)
        if self.layout.size > 1 and self.tp_unsupported:
            raise ValueError(f"tp_size: tensor parallelism with {self.tp_unsupported} ({config.model_type}) is not "
                             f"supported (use tp_size 1)")
        self.rotary = build_rotary(config, self.layout.head_dim, max_positions, ops)
        self.pipe = getattr(self.tp, "pipe", None)
        n = config.num_hidden_layers
        self.stage = PipeStage.of(self.pipe.index, self.pipe.count, n) if self.pipe else PipeStage.whole(n)
        if self.stage.holds_embedding(bool(getattr(config, "tie_word_embeddings", False))):
            if self.layout.size == 1:
                self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
            else:
                self.embed_tokens = VocabParallelEmbedding(self.layout, config.hidden_size, self.tp)
        self.layers = nn.ModuleList(self.make_layer(i) for i in self.stage.layers)
        if self.stage.is_last:
            self.norm = self.make_norm(config.hidden_size)
        self.init_lm_head(config, self.stage.is_last)

    # ------------------------------------------------------------------ what a family overrides
    def make_layer(self, layer_id: int) -> nn.Module:
        return DecoderLayer(self, layer_id)

    def make_norm(self, dim: int) -> nn.Module:
        return RMSNorm(dim, self.config.rms_norm_eps, self.ops)

    def attention_kwargs(self, layer_id: int) -> dict[str, Any]:
        return {"bias": bool(getattr(self.config, "attention_bias", False))}

    def layer_rotary(self, layer_id: int) -> RotaryEmbedding:
        return self.rotary

    def layer_types(self) -> list[str]:
        """``full_attention`` or ``sliding_attention`` per layer, as the config says (Mistral's
        ``sliding_window`` without ``layer_types`` windows every layer)."""
        n = self.config.num_hidden_layers
        types = getattr(self.config, "layer_types", None)
        if types:
            return list(types)
        return ["sliding_attention" if getattr(self.config, "sliding_window", None) else "full_attention"] * n

    def layer_attention(self) -> list[LayerAttention]:
        """What the attention backend must compute per layer.  A window at least as long as the
        longest context is no window."""
        window = getattr(self.config, "sliding_window", None)
        if window is not None and window >= self.max_positions:
            window = None
        cap = getattr(self.config, "attn_logit_softcapping", None)
        return [LayerAttention(window if t == "sliding_attention" else None, cap) for t in self.layer_types()]

    def kv_cache_shape(self) -> tuple[int, int, bool]:
        """``(kv_heads, head_dim, shared_kv)`` of the paged KV pool this rank needs per token and
        layer; ``shared_kv``: one tensor is both K and V (``KVPool``)."""
        attn = self.layers[0].self_attn
        return attn.num_kv_heads, attn.head_dim, False

    @classmethod
    def unsupported(cls, config: Any) -> list[str]:
        """Features of ``config`` this architecture does not build (the load names them)."""
        return []

    # ------------------------------------------------------------------ the step
    @property
    def native_layers(self) -> bool:
        """True when every layer is one ``layer_loop`` computes exactly (decided on the first
        call: layers keep their kinds once built)."""
        known = self.__dict__.get("_native_layers")
        if known is None:
            known = self.__dict__["_native_layers"] = all(getattr(layer, "plain", False) for layer in self.layers)
        return known

    @property
    def stackable(self) -> bool:
        """``native_layers``, all of which ``layer_stack``'s C++ loop runs too (Llama's, with q/k
        norms, partial rotary, GeGLU, Gemma's four norms and a rotary per layer type; it steps
        aside at run time where layers differ in anything but their attention and rotary)."""
        return self.native_layers

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        if self.embed_scale is not None:  # the reference rounds the scale to the activations' dtype
            x = x * torch.tensor(self.embed_scale, dtype=x.dtype)
        return x

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, backend: AttentionBackend,
                logit_rows: torch.Tensor) -> Optional[torch.Tensor]:
        hidden = self.final_hidden(batch, backend, logit_rows)
        return None if hidden is None else self.logits(hidden)

    @torch.inference_mode()
    def final_hidden(self, batch: ForwardBatch, backend: AttentionBackend, rows: torch.Tensor) -> torch.Tensor:
        """Run every layer over the batch (writing its KV); the final-normed hidden states of
        ``rows`` only ``[len(rows), hidden_size]`` (what the LM head and embeddings read), in
        fp32 whatever the model's dtype: rounding them to bf16 cost SmolLM2-135M (int4 weights,
        int8 head) 1.2 points of teacher-forced argmax agreement with fp32 (98.0% -> 99.2%).
        A pipeline stage other than the last hands its hidden states on and returns None."""
        if self.stage.is_first:
            x, residual = self.embed(batch.input_ids), None
        else:
            x, residual = self.pipe.recv_hidden(batch.input_ids.shape[0], self.config.hidden_size,
                                                self.act_dtype, batch.input_ids.device)
        lora = self.lora.step if self.lora is not None else None  # a step with LoRA adapters
        if layer_loop.usable(self, backend, x.dtype):  # the same ops without the module tree's overhead
            # (the C++ stack runs every layer of the pool: a pipeline stage runs the Python loop)
            stack = self.stackable and self.stage.count == 1
            native = layer_stack.run(self, x, batch, backend, lora) if stack else None
            x, residual = native if native is not None else layer_loop.run_layers(self, x, batch, backend, residual,
                                                                                  lora)
        else:
            # .forward on the containers: nn.Module.__call__'s hook checks cost about a microsecond a
            # call (the linear layers keep __call__: calibration hooks them)
            for layer in self.layers:
                x, residual = layer.forward(x, residual, batch, backend)
        if not self.stage.is_last:
            self.pipe.send_hidden(x, residual)
            return None
        return self.final_norm(x, residual, rows)

    def final_norm(self, x: torch.Tensor, residual: Optional[torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
        if residual is None:
            return self.norm(x.index_select(0, rows))
        x, residual = x.index_select(0, rows), residual.index_select(0, rows)
        if x.dtype == torch.float32:  # the fused op, exactly as every other layer's norm
            return self.norm.add_forward(x, residual)[0]
        return self.norm.add_forward_fp32(x, residual)

