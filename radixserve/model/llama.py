"""Llama-architecture causal LM (Llama 2/3, SmolLM2, Mistral, Qwen2) over the paged KV pool.

Written against ``ForwardBatch``: tokens of all requests are packed in one dimension and
attention goes through an ``AttentionBackend``.  Weight names follow Hugging Face's so that
checkpoints load directly (q/k/v and gate/up are fused at load time).

Tensor parallelism: built with a ``TPLayout`` and a group (``parallel/``), a rank holds its
query/KV heads, MLP columns and vocabulary shard (sliced at load time); o_proj and down_proj
outputs are all-reduced and the logits gathered on rank 0 (None on the other ranks).  With
the default ``NoTP`` group the collectives are identities and the layers are the full ones.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from radixserve.attention.base import AttentionBackend, ForwardBatch
from radixserve.model import layer_loop, layer_stack
from radixserve.model.fused_ops import TorchOps
from radixserve.model.layers import GatedMLP, RMSNorm, RotaryEmbedding, rope_parameters
from radixserve.model.tp_layers import VocabParallelEmbedding
from radixserve.parallel.group import NoTP
from radixserve.parallel.layout import TPLayout


def _qkv_bias(config: Any) -> bool:
    return bool(getattr(config, "attention_bias", False)) or config.model_type == "qwen2"


class Attention(nn.Module):
    def __init__(self, config: Any, layer_id: int, rotary: RotaryEmbedding, layout: TPLayout, tp: Any) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.num_heads = layout.num_heads  # this rank's heads (all of them without TP)
        self.num_kv_heads = layout.num_kv_heads
        self.head_dim = layout.head_dim
        self.tp = tp
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scaling = self.head_dim ** -0.5
        self.qkv_proj = nn.Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=_qkv_bias(config))
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=False)
        self.rotary = rotary

    def forward(self, x: torch.Tensor, batch: ForwardBatch, backend: AttentionBackend) -> torch.Tensor:
        qkv = self.qkv_proj(x)
        if qkv.dtype == backend.caller_stores_kv and self.rotary.fused:
            # one native pass: rotary on q (into a contiguous q) and k, K/V into the pool slots
            pool, lid = backend.kv_pool, self.layer_id
            q = self.rotary.rope_store_kv(qkv, batch.positions, pool.k_buffer[lid], pool.v_buffer[lid],
                                          batch.out_cache_loc, qkv.new_empty(qkv.shape[0], self.num_heads,
                                                                             self.head_dim))
            out = backend.attend(q, None, None, lid, self.scaling, batch)
            return self.tp.all_reduce(self.o_proj(out.view(-1, self.q_size)))
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        self.rotary.forward(batch.positions, q, k)
        out = backend.forward(q, k, v, self.layer_id, self.scaling, batch)
        return self.tp.all_reduce(self.o_proj(out.reshape(-1, self.q_size)))


class DecoderLayer(nn.Module):
    def __init__(self, config: Any, layer_id: int, rotary: RotaryEmbedding, ops: type[TorchOps], layout: TPLayout,
                 tp: Any) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)
        self.self_attn = Attention(config, layer_id, rotary, layout, tp)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)
        self.mlp = GatedMLP(config.hidden_size, layout.intermediate, bool(getattr(config, "mlp_bias", False)), ops,
                            tp)

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


class LlamaForCausalLM(nn.Module):
    """``forward`` returns fp32 logits only for the rows in ``logit_rows`` (by default the
    last new token of each request), so the LM head never runs over a whole prompt unless
    prompt logprobs are asked for."""

    def __init__(self, config: Any, max_positions: int, ops: type[TorchOps] = TorchOps, tp: Any = None,
                 layout: Optional[TPLayout] = None) -> None:
        super().__init__()
        self.config = config
        self.tp = tp or NoTP()
        self.layout = layout or TPLayout.of(config)
        self.rotary = RotaryEmbedding(self.layout.head_dim, max_positions, rope_parameters(config), ops)
        if self.layout.size == 1:
            self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        else:
            self.embed_tokens = VocabParallelEmbedding(self.layout, config.hidden_size, self.tp)
        self.layers = nn.ModuleList(DecoderLayer(config, i, self.rotary, ops, self.layout, self.tp)
                                    for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        if not self.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, self.layout.vocab_shard, bias=False)
        # a quantized LM head for calls of at most lm_head_max_m rows (model/quant.py)
        self.lm_head_quant: Optional[nn.Module] = None
        self.lm_head_max_m: Optional[int] = None
        self.lm_head_packed: Optional[nn.Module] = None  # the dense head on packed weights (packed_linear.py)

    def lm_head_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.tie_word_embeddings else self.lm_head.weight

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, backend: AttentionBackend, logit_rows: torch.Tensor) -> torch.Tensor:
        return self.logits(self.final_hidden(batch, backend, logit_rows))

    @torch.inference_mode()
    def final_hidden(self, batch: ForwardBatch, backend: AttentionBackend, rows: torch.Tensor) -> torch.Tensor:
        """Run every layer over the batch (writing its KV); the final-normed hidden states of
        ``rows`` only ``[len(rows), hidden_size]`` (what the LM head and embeddings read), in
        fp32 whatever the model's dtype: rounding them to bf16 cost SmolLM2-135M (int4 weights,
        int8 head) 1.2 points of teacher-forced argmax agreement with fp32 (98.0% -> 99.2%)."""
        x, residual = self.embed_tokens(batch.input_ids), None
        if layer_loop.usable(self, backend, x.dtype):  # the same ops without the module tree's overhead
            native = layer_stack.run(self, x, batch, backend)  # ... or without Python's
            x, residual = native if native is not None else layer_loop.run_layers(self, x, batch, backend)
        else:
            # .forward on the containers: nn.Module.__call__'s hook checks cost about a microsecond a
            # call (the linear layers keep __call__: calibration hooks them)
            for layer in self.layers:
                x, residual = layer.forward(x, residual, batch, backend)
        if residual is None:
            return self.norm(x.index_select(0, rows))
        x, residual = x.index_select(0, rows), residual.index_select(0, rows)
        if x.dtype == torch.float32:  # the fused op, exactly as every other layer's norm
            return self.norm.add_forward(x, residual)[0]
        return self.norm.add_forward_fp32(x, residual)

    @torch.inference_mode()
    def logits(self, x: torch.Tensor) -> Optional[torch.Tensor]:
        """fp32 logits of final hidden states ``x`` (fp32 or the model's dtype; under TP: on rank
        0; None on the others).  The quantized head reads fp32 x as it is; a dense one in its dtype."""
        if self.lm_head_quant is not None and (self.lm_head_max_m is None or x.shape[0] <= self.lm_head_max_m):
            return self.lm_head_quant(x).float()
        if self.lm_head_packed is not None:
            return self.lm_head_packed(x.to(self.lm_head_packed.weight_dtype)).float()
        w = self.lm_head_weight()
        return self.tp.gather_vocab(F.linear(x.to(w.dtype), w).float(), self.config.vocab_size)

    # ------------------------------------------------------------------ weights
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load Hugging Face-named tensors (this rank's slice of each), fusing q/k/v and gate/up projections."""
        params = dict(self.named_parameters())
        pending: dict[str, dict[str, torch.Tensor]] = {}
        fused = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
                 "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}
        parts_needed = {"qkv_proj": 3, "gate_up_proj": 2}
        loaded: set[str] = set()
        for name, tensor in weights:
            name = name.removeprefix("model.")
            if "rotary_emb" in name:
                continue
            if name == "lm_head.weight" and self.tie_word_embeddings:
                continue
            tensor = self.layout.shard(name, tensor)
            for short, (target, idx) in fused.items():
                if f".{short}." in name:
                    fused_name = name.replace(short, target)
                    group = pending.setdefault(fused_name, {})
                    group[idx] = tensor
                    if len(group) == parts_needed[target]:
                        whole = torch.cat([group[i] for i in range(len(group))], dim=0)
                        self._copy(params, fused_name, whole)
                        loaded.add(fused_name)
                        del pending[fused_name]
                    break
            else:
                self._copy(params, name, tensor)
                loaded.add(name)
        missing = set(params) - loaded
        if missing or pending:
            raise ValueError(f"checkpoint is missing weights: {sorted(missing | set(pending))[:8]}")

    @staticmethod
    def _copy(params: dict[str, nn.Parameter], name: str, tensor: torch.Tensor) -> None:
        if name not in params:
            raise ValueError(f"unexpected weight {name!r} in checkpoint")
        p = params[name]
        if p.shape != tensor.shape:
            raise ValueError(f"weight {name}: checkpoint shape {tuple(tensor.shape)} != model {tuple(p.shape)}")
        with torch.no_grad():
            p.copy_(tensor.to(p.dtype))
