"""DeepSeek-V2 / V2-Lite and DeepSeek-V3: multi-head latent attention (``mla.py``) with the
compressed KV in the paged pool, dense gated MLPs in the first ``first_k_dense_replace`` layers
and mixture-of-experts MLPs after them: routed experts (``moe.Experts``, grouped) chosen by
``DeepseekRouter`` plus always-on shared experts.

Routing, as transformers 5.25 computes it (weights in fp32, times ``routed_scaling_factor``):

* V2: softmax scores; ``topk_method`` ``greedy`` (top-k of all experts) or
  ``group_limited_greedy`` (top-k among the experts of the ``topk_group`` groups, of ``n_group``,
  whose best expert scores highest); not renormalised.
* V3: sigmoid scores; the choice adds ``e_score_correction_bias`` and ranks groups by the sum of
  their top-2 choice scores; the weights are the chosen experts' plain scores, renormalised when
  ``norm_topk_prob``.

Checkpoints: per-expert tensors are stacked as for the other MoE families (``layers/moe_decoder.py``);
V3's multi-token-prediction layers (``layers.N`` past ``num_hidden_layers``) are skipped, as the
reference skips them.  Tensor parallelism is refused (the latent is one KV head that every query
head reads).  Quantization (``--quantization``): attention, dense and shared-expert linear
layers are quantized as in any model; the router, the routed experts and the absorbed
``W_UK``/``W_UV`` stay in the model's dtype (the router's logits are computed in fp32 from it).
FP8 block-quantized checkpoints (V3's ``quantization_config``) are not read.
"""
from __future__ import annotations

import re
from typing import Any, Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from radixserve.model.layers.decoder import DecoderLayer
from radixserve.model.cpu.fused_ops import TorchOps
from radixserve.model.layers.norm_mlp import GatedMLP, act_mul, activation
from radixserve.model.layers.mla import MLAttention, deinterleave_rope_rows
from radixserve.model.layers.moe import Experts, Routing
from radixserve.model.layers.moe_decoder import MoEDecoderLM, MoESpec
from radixserve.model.registry import register

LAYER = re.compile(r"^layers\.(\d+)\.")
V2_METHODS = ("greedy", "group_limited_greedy")


def _keep_groups(scores: torch.Tensor, group_scores: torch.Tensor, topk_group: int, fill: float) -> torch.Tensor:
    """``scores [T, E]`` with every expert outside the ``topk_group`` best groups set to ``fill``."""
    keep = torch.zeros_like(group_scores).scatter_(1, torch.topk(group_scores, topk_group, dim=-1, sorted=False)[1], 1)
    return scores.masked_fill(~keep.bool().repeat_interleave(scores.shape[1] // keep.shape[1], dim=1), fill)


class DeepseekRouter(nn.Module):
    """The ``gate`` of a MoE layer: ``x [T, hidden] -> (weights fp32 [T, k], expert ids [T, k])``."""

    def __init__(self, config: Any, v3: bool) -> None:
        super().__init__()
        self.v3 = v3
        self.top_k, self.scale = config.num_experts_per_tok, float(config.routed_scaling_factor)
        self.n_group, self.topk_group = config.n_group, config.topk_group
        self.method = None if v3 else config.topk_method
        self.norm_topk_prob = bool(getattr(config, "norm_topk_prob", False))
        self.weight = nn.Parameter(torch.empty(config.n_routed_experts, config.hidden_size))
        self.e_score_correction_bias = nn.Parameter(torch.zeros(config.n_routed_experts)) if v3 else None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = F.linear(x.float(), self.weight.float())
        t = logits.shape[0]
        if not self.v3:
            scores = logits.softmax(dim=-1)
            if self.method == "group_limited_greedy":
                groups = scores.view(t, self.n_group, -1).max(dim=-1).values
                scores = _keep_groups(scores, groups, self.topk_group, 0.0)
            weights, ids = torch.topk(scores, self.top_k, dim=-1, sorted=False)
            return weights * self.scale, ids
        scores = logits.sigmoid()
        choice = scores + self.e_score_correction_bias.float()
        groups = choice.view(t, self.n_group, -1).topk(2, dim=-1)[0].sum(dim=-1)
        choice = _keep_groups(choice, groups, self.topk_group, float("-inf"))
        ids = torch.topk(choice, self.top_k, dim=-1, sorted=False)[1]
        weights = scores.gather(1, ids)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * self.scale, ids


class DeepseekMoE(nn.Module):
    """Routed experts plus ``n_shared_experts`` always-on experts (one MLP of their summed width)."""

    def __init__(self, config: Any, ops: type[TorchOps], v3: bool) -> None:
        super().__init__()
        act, hidden, inter = activation(config), config.hidden_size, config.moe_intermediate_size
        self.gate = DeepseekRouter(config, v3)
        self.experts = Experts(config.n_routed_experts, hidden, inter, act_mul(ops, act))
        shared = int(config.n_shared_experts or 0)
        self.shared_experts = GatedMLP(hidden, inter * shared, bool(getattr(config, "mlp_bias", False)), ops,
                                       act=act) if shared else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.experts(x, *self.gate(x))
        return out if self.shared_experts is None else out + self.shared_experts(x)


class MLALayer(DecoderLayer):
    """``DecoderLayer``'s pre-norm layer with latent attention and the model's ``make_mlp``."""

    def __init__(self, model: "DeepseekV2ForCausalLM", layer_id: int) -> None:
        nn.Module.__init__(self)
        config = model.config
        self.input_layernorm = model.make_norm(config.hidden_size)
        self.self_attn = MLAttention(config, layer_id, model.layer_rotary(layer_id), model.ops)
        self.post_attention_layernorm = model.make_norm(config.hidden_size)
        self.mlp = model.make_mlp(layer_id)


@register("deepseek_v2")
class DeepseekV2ForCausalLM(MoEDecoderLM):
    v3 = False
    tp_unsupported = "multi-head latent attention"  # (and experts; the latent is the first to name)

    def sparse_layer(self, layer_id: int) -> bool:
        """Every layer from ``first_k_dense_replace`` on (every ``moe_layer_freq``-th, as DeepSeek's
        own code reads it; transformers ignores the field, 1 in every released config)."""
        cfg = self.config
        freq = int(getattr(cfg, "moe_layer_freq", 1) or 1)
        return layer_id >= (cfg.first_k_dense_replace or 0) and layer_id % freq == 0

    def moe_spec(self) -> MoESpec:  # (the stacking of per-expert checkpoint tensors reads it)
        cfg = self.config
        return MoESpec(cfg.n_routed_experts, cfg.moe_intermediate_size, Routing(cfg.num_experts_per_tok, False, True))

    def make_layer(self, layer_id: int) -> nn.Module:
        return MLALayer(self, layer_id)

    def make_mlp(self, layer_id: int) -> nn.Module:
        cfg = self.config
        if self.sparse_layer(layer_id):
            return DeepseekMoE(cfg, self.ops, self.v3)
        return GatedMLP(cfg.hidden_size, cfg.intermediate_size, bool(getattr(cfg, "mlp_bias", False)), self.ops,
                        self.tp, activation(cfg))

    def kv_cache_shape(self) -> tuple[int, int, bool]:
        return 1, self.layers[0].self_attn.head_dim, True

    @classmethod
    def unsupported(cls, config: Any) -> list[str]:
        method = getattr(config, "topk_method", "greedy")
        return [] if cls.v3 or method in V2_METHODS else [f"topk_method {method!r} ({', '.join(V2_METHODS)})"]

    def rope_interleaved(self) -> bool:
        return True

    def checkpoint_tensors(self, name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        cfg = self.config
        layer = LAYER.match(name)
        if layer is not None and int(layer.group(1)) >= cfg.num_hidden_layers:
            return  # V3's multi-token-prediction layer
        rope = cfg.qk_rope_head_dim
        if ".self_attn.q_proj." in name or ".self_attn.q_b_proj." in name:
            if self.rope_interleaved():
                tensor = deinterleave_rope_rows(tensor, cfg.qk_nope_head_dim + rope, rope)
            name = name.replace(".q_proj.", ".wq.")
        elif ".self_attn.kv_a_proj_with_mqa." in name and self.rope_interleaved():
            tensor = deinterleave_rope_rows(tensor, cfg.kv_lora_rank + rope, rope)
        yield from super().checkpoint_tensors(name, tensor)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(weights)
        for layer in self.layers:
            layer.self_attn.absorb()


@register("deepseek_v3")
class DeepseekV3ForCausalLM(DeepseekV2ForCausalLM):
    """V2's layers with V3's sigmoid routing; rotary interleaved only with ``rope_interleave``."""

    v3 = True

    def rope_interleaved(self) -> bool:
        return bool(getattr(self.config, "rope_interleave", True))

    @classmethod
    def unsupported(cls, config: Any) -> list[str]:
        return ["an FP8 quantization_config"] if getattr(config, "quantization_config", None) else []
