"""Mixtral: Llama's decoder with a sparse mixture of experts (softmax top-k routing) in every layer."""
from __future__ import annotations

from radixserve.model.layers.moe import Routing
from radixserve.model.layers.moe_decoder import MoEDecoderLM, MoESpec
from radixserve.model.registry import register


@register("mixtral")
class MixtralForCausalLM(MoEDecoderLM):
    """Softmax, top-k, always renormalised, weights kept in fp32; Mistral's sliding window."""

    def moe_spec(self) -> MoESpec:
        cfg = self.config
        return MoESpec(cfg.num_local_experts, cfg.intermediate_size, Routing(cfg.num_experts_per_tok, True, True))
