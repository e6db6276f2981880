"""Gemma 2 and Gemma 3 (text): ``DecoderLM`` with Gemma's differences from Llama, as
transformers computes them.

* embeddings multiplied by ``sqrt(hidden_size)``, that scale rounded to the activations' dtype;
* RMSNorm ``normalize(x) * (1 + w)``: the ``1 + w`` is computed in fp32 at load time and loaded
  as the weight of the shared ``RMSNorm`` (so fp32 is exact; in bf16 ``1 + w`` is rounded once);
* four norms per layer (``GemmaDecoderLayer``): attention and MLP outputs are normed before they
  join the residual stream;
* GeGLU MLP (``hidden_activation``), softmax scale ``query_pre_attn_scalar ** -0.5``;
* sliding-window layers mixed with full ones (``layer_types``, ``sliding_window``);
* Gemma 2: attention and final logit soft-capping;
* Gemma 3: per-head q/k norms (Gemma's norm), rope per layer type (``rope_parameters`` keyed by
  ``sliding_attention``/``full_attention``), final logit soft-capping when set.  Its
  ``attn_logit_softcapping`` is ignored, as transformers' Gemma 3 attention ignores it.

The multimodal ``gemma3`` config is refused by ``loader.load_config``.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Iterator, Optional

import torch

from radixserve.attention.base import AttentionBackend, ForwardBatch, LayerAttention
from radixserve.model.layers.decoder import DecoderLayer, DecoderLM
from radixserve.model.cpu.fused_ops import TorchOps
from radixserve.model.registry import register
from radixserve.model.layers.rotary import RotaryEmbedding, build_rotary, rope_parameters
from radixserve.parallel.layout import TPLayout


class GemmaDecoderLayer(DecoderLayer):
    """Gemma 2/3's layer: ``h = x + post_attn(attn(input(x))); out = h + post_ff(mlp(pre_ff(h)))``.
    ``forward`` keeps ``DecoderLayer``'s contract: it returns the (normed) MLP output and the
    fp32 residual stream before it, and adds the previous layer's output to the stream."""

    flat_loop = True  # layer_loop runs it (its extra norms included)

    def __init__(self, model: DecoderLM, layer_id: int) -> None:
        super().__init__(model, layer_id)
        self.pre_feedforward_layernorm = model.make_norm(model.config.hidden_size)
        self.post_feedforward_layernorm = model.make_norm(model.config.hidden_size)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, batch: ForwardBatch,
                backend: AttentionBackend) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual, x = x.float(), self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm.add_forward(x, residual)
        x = self.post_attention_layernorm(self.self_attn.forward(x, batch, backend))
        x, residual = self.pre_feedforward_layernorm.add_forward(x, residual)
        return self.post_feedforward_layernorm(self.mlp.forward(x)), residual


@register("gemma2")
class Gemma2ForCausalLM(DecoderLM):
    qk_norm = False  # Gemma 3 normalizes each query and key head

    def __init__(self, config: Any, max_positions: int, ops: type[TorchOps] = TorchOps, tp: Any = None,
                 layout: Optional[TPLayout] = None) -> None:
        super().__init__(config, max_positions, ops, tp, layout)
        # the reference holds sqrt(hidden) as an fp32 tensor and rounds it to the weights' dtype
        self.embed_scale = float(torch.tensor(config.hidden_size ** 0.5, dtype=torch.float32))
        self.final_logit_softcap = getattr(config, "final_logit_softcapping", None)

    def make_layer(self, layer_id: int) -> GemmaDecoderLayer:
        return GemmaDecoderLayer(self, layer_id)

    def attention_kwargs(self, layer_id: int) -> dict[str, Any]:
        kw: dict[str, Any] = {"scaling": float(self.config.query_pre_attn_scalar) ** -0.5}
        if self.qk_norm:
            kw["qk_norm"] = self.make_norm
        return kw

    def layer_rotary(self, layer_id: int) -> RotaryEmbedding:
        """The rotary of the layer's type (one table per distinct rope; the model's own when equal)."""
        kind = self.layer_types()[layer_id]
        params = rope_parameters(self.config, kind)
        if params == rope_parameters(self.config):
            return self.rotary
        cache = self.__dict__.setdefault("_type_rotaries", {})  # registered through the layers using it
        if kind not in cache:
            cache[kind] = build_rotary(self.config, self.layout.head_dim, self.max_positions, self.ops, kind)
        return cache[kind]

    def checkpoint_tensors(self, name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        if name.endswith("norm.weight"):  # Gemma's norms scale by 1 + w (in fp32, as the reference)
            tensor = 1.0 + tensor.float()
        yield name, tensor

    @classmethod
    def unsupported(cls, config: Any) -> list[str]:
        missing = []
        if getattr(config, "use_bidirectional_attention", False):
            missing.append("use_bidirectional_attention")
        if getattr(config, "attention_bias", False):
            missing.append("attention_bias")
        return missing


@register("gemma3_text")
class Gemma3ForCausalLM(Gemma2ForCausalLM):
    qk_norm = True

    def layer_attention(self) -> list[LayerAttention]:
        return [replace(la, logit_softcap=None) for la in super().layer_attention()]
