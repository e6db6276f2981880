"""Llama 2/3, SmolLM2, Mistral and Qwen 2: ``DecoderLM`` as it is (Qwen 2 adds q/k/v biases)."""
from __future__ import annotations

from typing import Any

from radixserve.model.layers.decoder import DecoderLM
from radixserve.model.registry import register


@register("llama", "mistral", "qwen2")
class LlamaForCausalLM(DecoderLM):
    def attention_kwargs(self, layer_id: int) -> dict[str, Any]:
        bias = bool(getattr(self.config, "attention_bias", False)) or self.config.model_type == "qwen2"
        return {"bias": bias}
