"""Qwen 3 (dense): Llama with an RMSNorm over each query and key head before rotary, and an
explicit ``head_dim`` (not ``hidden / heads``)."""
from __future__ import annotations

from functools import partial
from typing import Any

from radixserve.model.layers.decoder import DecoderLM
from radixserve.model.layers.norm_mlp import RMSNorm
from radixserve.model.registry import register


@register("qwen3")
class Qwen3ForCausalLM(DecoderLM):
    def attention_kwargs(self, layer_id: int) -> dict[str, Any]:
        return {"bias": bool(getattr(self.config, "attention_bias", False)),
                "qk_norm": partial(RMSNorm, eps=self.config.rms_norm_eps, ops=self.ops)}
