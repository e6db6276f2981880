"""Qwen2-MoE and Qwen3-MoE: Qwen's decoder with sparse experts (``mlp_only_layers`` and
``decoder_sparse_step`` keep some layers dense)."""
from __future__ import annotations

from functools import partial
from typing import Any

from radixserve.model.layers.moe import Routing
from radixserve.model.layers.moe_decoder import MoEDecoderLM, MoESpec
from radixserve.model.layers.norm_mlp import RMSNorm
from radixserve.model.registry import register


@register("qwen2_moe")
class Qwen2MoeForCausalLM(MoEDecoderLM):
    """q/k/v biases (``qkv_bias``), ``norm_topk_prob``, a sigmoid-gated shared expert."""

    def attention_kwargs(self, layer_id: int) -> dict[str, Any]:
        return {"bias": bool(getattr(self.config, "qkv_bias", True))}

    def moe_spec(self) -> MoESpec:
        cfg = self.config
        return MoESpec(cfg.num_experts, cfg.moe_intermediate_size,
                       Routing(cfg.num_experts_per_tok, bool(cfg.norm_topk_prob), False),
                       cfg.shared_expert_intermediate_size)


@register("qwen3_moe")
class Qwen3MoeForCausalLM(MoEDecoderLM):
    """Qwen 3's per-head q/k norms, ``norm_topk_prob``, no shared expert."""

    def attention_kwargs(self, layer_id: int) -> dict[str, Any]:
        return {"qk_norm": partial(RMSNorm, eps=self.config.rms_norm_eps, ops=self.ops)}

    def moe_spec(self) -> MoESpec:
        cfg = self.config
        return MoESpec(cfg.num_experts, cfg.moe_intermediate_size,
                       Routing(cfg.num_experts_per_tok, bool(cfg.norm_topk_prob), False))

    @classmethod
    def unsupported(cls, config: Any) -> list[str]:
        # the reference also gives o_proj a bias then, which Attention does not hold
        return ["attention_bias"] if getattr(config, "attention_bias", False) else []
