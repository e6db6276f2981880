"""The decoder of the mixture-of-experts families (``moe.SparseMoE`` in place of the MLP).

Each family (``arch/mixtral.py``, ``arch/qwen_moe.py``, ``arch/deepseek_v2.py``) says in ``moe_spec`` how its
config sizes and routes the experts; ``MoEDecoderLM``
builds every layer as Llama's with that block as ``mlp`` (Qwen's ``mlp_only_layers`` and
``decoder_sparse_step`` keep some layers dense).  Such layers are never ``DecoderLayer.plain``, so
these models always run the module path (``native_layers`` is False).

Checkpoints: published ones (and transformers 5.25's ``save_pretrained``) hold one tensor per
expert, ``mlp.experts.N.{gate,up,down}_proj`` (Qwen) or ``block_sparse_moe.experts.N.w{1,3,2}``
(Mixtral, whose ``block_sparse_moe`` is renamed ``mlp``); ``checkpoint_tensors`` collects a
layer's experts and stacks them into ``mlp.experts.gate_up_proj [E, 2I, H]`` and
``mlp.experts.down_proj [E, H, I]``, the names a fused checkpoint (transformers' in-memory layout)
already has.  Tensor parallelism is not built for experts: a layout of more than one rank raises.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Iterator

import torch
from torch import nn

from radixserve.model.layers.decoder import Attention, DecoderLayer, DecoderLM
from radixserve.model.layers.norm_mlp import GatedMLP, activation
from radixserve.model.layers.moe import Routing, SparseMoE

PER_EXPERT = re.compile(r"^(.*)\.experts\.(\d+)\.(w1|w2|w3|gate_proj|up_proj|down_proj)\.weight$")
PART = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}


@dataclass(frozen=True)
class MoESpec:
    """A family's experts: how many, their width, the routing and the shared expert's width (0: none)."""

    num_experts: int
    intermediate: int
    routing: Routing
    shared_intermediate: int = 0


class MoEDecoderLayer(DecoderLayer):
    """Llama's pre-norm layer with ``mlp`` given (a ``SparseMoE`` or a dense ``GatedMLP``)."""

    def __init__(self, model: DecoderLM, layer_id: int, mlp: nn.Module) -> None:
        nn.Module.__init__(self)  # DecoderLayer's own __init__ would build (and throw away) a dense MLP
        config = model.config
        self.input_layernorm = model.make_norm(config.hidden_size)
        self.self_attn = Attention(config, layer_id, model.layer_rotary(layer_id), model.layout, model.tp,
                                   **model.attention_kwargs(layer_id))
        self.post_attention_layernorm = model.make_norm(config.hidden_size)
        self.mlp = mlp


class MoEDecoderLM(DecoderLM):
    """A decoder whose sparse layers hold ``SparseMoE(moe_spec())``; the others a dense MLP of
    ``intermediate_size``."""

    tp_unsupported = "mixture-of-experts"

    def moe_spec(self) -> MoESpec:
        raise NotImplementedError

    def sparse_layer(self, layer_id: int) -> bool:
        """Qwen's rule (Mixtral's config has neither field: every layer is sparse)."""
        cfg = self.config
        return (layer_id not in (getattr(cfg, "mlp_only_layers", None) or [])
                and (layer_id + 1) % getattr(cfg, "decoder_sparse_step", 1) == 0)

    def make_layer(self, layer_id: int) -> nn.Module:
        cfg, act = self.config, activation(self.config)
        if self.sparse_layer(layer_id):
            spec = self.moe_spec()
            mlp: nn.Module = SparseMoE(cfg.hidden_size, spec.num_experts, spec.intermediate, spec.routing, self.ops,
                                       act, spec.shared_intermediate)
        else:
            mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, False, self.ops, self.tp, act)
        return MoEDecoderLayer(self, layer_id, mlp)

    # ------------------------------------------------------------------ checkpoints
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        self._expert_parts: dict[str, dict[tuple[int, str], torch.Tensor]] = {}  # stacked name -> parts so far
        try:
            super().load_weights(weights)
        finally:
            self._expert_parts = {}

    def checkpoint_tensors(self, name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        name = name.replace(".block_sparse_moe.", ".mlp.")
        m = PER_EXPERT.match(name)
        if m is None:
            yield name, tensor
            return
        prefix, expert, part = m.group(1), int(m.group(2)), PART.get(m.group(3), m.group(3))
        stacked = "down_proj" if part == "down_proj" else "gate_up_proj"
        key = f"{prefix}.experts.{stacked}"
        parts = self._expert_parts.setdefault(key, {})
        parts[(expert, part)] = tensor
        n = self.moe_spec().num_experts
        if len(parts) < (n if stacked == "down_proj" else 2 * n):
            return
        del self._expert_parts[key]
        if stacked == "down_proj":
            yield key, torch.stack([parts[(e, "down_proj")] for e in range(n)])
        else:
            yield key, torch.stack([torch.cat([parts[(e, "gate_proj")], parts[(e, "up_proj")]]) for e in range(n)])
