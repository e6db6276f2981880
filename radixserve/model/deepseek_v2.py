"""DeepSeek-V2 (and V2-Lite): multi-head latent attention (``mla.py``) with the compressed KV in
the paged pool, dense gated MLPs in the first ``first_k_dense_replace`` layers and
mixture-of-experts MLPs after them.

Tensor parallelism is refused (the latent is one KV head that every query head reads).
Quantization (``--quantization``): every ``nn.Linear`` of the layers is quantized as in any
model; the absorbed ``W_UK``/``W_UV`` products stay in the model's dtype.
"""
from __future__ import annotations

from typing import Any, Iterable, Iterator, Optional

import torch
from torch import nn

from radixserve.model.decoder import DecoderLayer, DecoderLM
from radixserve.model.fused_ops import TorchOps
from radixserve.model.layers import GatedMLP, activation
from radixserve.model.mla import MLAttention, deinterleave_rope_rows
from radixserve.model.registry import register
from radixserve.parallel.layout import TPLayout


class MLALayer(DecoderLayer):
    """``DecoderLayer``'s pre-norm layer with latent attention and the model's ``make_mlp``."""

    def __init__(self, model: "DeepseekV2ForCausalLM", layer_id: int) -> None:
        nn.Module.__init__(self)
        config = model.config
        self.input_layernorm = model.make_norm(config.hidden_size)
        self.self_attn = MLAttention(config, layer_id, model.layer_rotary(layer_id), model.ops)
        self.post_attention_layernorm = model.make_norm(config.hidden_size)
        self.mlp = model.make_mlp(layer_id)


def is_moe_layer(config: Any, layer_id: int) -> bool:
    """The reference's rule: every layer from ``first_k_dense_replace`` on (every
    ``moe_layer_freq``-th, as DeepSeek's own code reads it; 1 in every released config)."""
    freq = int(getattr(config, "moe_layer_freq", 1) or 1)
    return (getattr(config, "n_routed_experts", None) is not None and layer_id >= config.first_k_dense_replace
            and layer_id % freq == 0)


@register("deepseek_v2")
class DeepseekV2ForCausalLM(DecoderLM):
    def __init__(self, config: Any, max_positions: int, ops: type[TorchOps] = TorchOps, tp: Any = None,
                 layout: Optional[TPLayout] = None) -> None:
        if (tp is not None and tp.size > 1) or (layout is not None and layout.size > 1):
            raise ValueError(f"model: {config.model_type}: tensor parallelism with multi-head latent attention "
                             "is not supported (serve it with tp_size 1)")
        super().__init__(config, max_positions, ops, tp, layout)

    def make_layer(self, layer_id: int) -> nn.Module:
        return MLALayer(self, layer_id)

    def make_mlp(self, layer_id: int) -> nn.Module:
        cfg = self.config
        if is_moe_layer(cfg, layer_id):
            raise ValueError(f"model: {cfg.model_type}: mixture-of-experts layers are not built yet")
        return GatedMLP(cfg.hidden_size, cfg.intermediate_size, bool(getattr(cfg, "mlp_bias", False)), self.ops,
                        self.tp, activation(cfg))

    def kv_cache_shape(self) -> tuple[int, int, bool]:
        attn = self.layers[0].self_attn
        return 1, attn.head_dim, True

    @classmethod
    def unsupported(cls, config: Any) -> list[str]:
        if any(is_moe_layer(config, i) for i in range(config.num_hidden_layers)):
            return ["mixture-of-experts layers (first_k_dense_replace < num_hidden_layers)"]
        return []

    def checkpoint_tensors(self, name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        cfg = self.config
        rope = cfg.qk_rope_head_dim
        if ".self_attn.q_proj." in name or ".self_attn.q_b_proj." in name:
            tensor = deinterleave_rope_rows(tensor, cfg.qk_nope_head_dim + rope, rope)
            name = name.replace(".q_proj.", ".wq.")
        elif ".self_attn.kv_a_proj_with_mqa." in name:
            tensor = deinterleave_rope_rows(tensor, cfg.kv_lora_rank + rope, rope)
        yield name, tensor

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(weights)
        for layer in self.layers:
            layer.self_attn.absorb()
