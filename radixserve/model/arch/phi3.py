"""Phi-3 and Phi-4-mini: Llama with q/k/v and gate/up fused in the checkpoint (split here, so
that tensor parallelism slices them like Llama's), ``partial_rotary_factor`` and LongRoPE
(``rotary.py``)."""
from __future__ import annotations

from typing import Iterator

import torch

from radixserve.model.layers.decoder import DecoderLM
from radixserve.model.registry import register


@register("phi3")
class Phi3ForCausalLM(DecoderLM):
    def checkpoint_tensors(self, name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        if ".qkv_proj." in name:
            cfg, d = self.config, self.layout.head_dim
            sizes = [cfg.num_attention_heads * d, cfg.num_key_value_heads * d, cfg.num_key_value_heads * d]
            for short, part in zip(("q_proj", "k_proj", "v_proj"), tensor.split(sizes, dim=0)):
                yield name.replace("qkv_proj", short), part
        elif ".gate_up_proj." in name:
            gate, up = tensor.chunk(2, dim=0)
            yield name.replace("gate_up_proj", "gate_proj"), gate
            yield name.replace("gate_up_proj", "up_proj"), up
        else:
            yield name, tensor
