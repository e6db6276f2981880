"""Tiny random checkpoints of every model family (no download), for tests against transformers.

``FAMILIES[name]()`` gives ``(config_class, kwargs)`` of a small config that exercises the
family's features (head_dim != hidden / heads, sliding windows of ``WINDOW`` tokens mixed with
full layers, soft-capping, partial rotary, experts, ...); ``build_family(name, path, smol_dir)``
saves that model with SmolLM2's tokenizer and returns the transformers model (fp32, eval).
Prompts in the tests are longer than ``WINDOW`` so a wrong window shows.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

WINDOW = 24
VOCAB = 49152  # SmolLM2's tokenizer
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=1024, rms_norm_eps=1e-6)


def _llama():
    from transformers import LlamaConfig

    return LlamaConfig, dict(COMMON, tie_word_embeddings=True)


def _mistral_window():
    from transformers import MistralConfig

    return MistralConfig, dict(COMMON, tie_word_embeddings=False, head_dim=32, sliding_window=WINDOW)


def _qwen2():
    from transformers import Qwen2Config

    return Qwen2Config, dict(COMMON, tie_word_embeddings=True)  # q/k/v biases


def _qwen3():
    from transformers import Qwen3Config

    return Qwen3Config, dict(COMMON, head_dim=32, tie_word_embeddings=True)


def _phi3():
    from transformers import Phi3Config

    # Phi-4-mini's shape: partial rotary and LongRoPE (short factors up to the original length)
    half = 16 * 3 // 4 // 2  # rotary_dim / 2 frequencies of a 16-wide head at factor 0.75 -> 6
    return Phi3Config, dict(COMMON, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                            partial_rotary_factor=0.75, tie_word_embeddings=False, pad_token_id=0,
                            original_max_position_embeddings=512,
                            rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                             "short_factor": [1.0 + 0.1 * i for i in range(half)],
                                             "long_factor": [2.0 + 0.5 * i for i in range(half)]})


def _gemma(**kw: Any) -> dict[str, Any]:
    # 4 layers, 2 sliding + 2 full; head_dim != hidden / heads; query_pre_attn_scalar != head_dim
    types = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
    return dict(COMMON, num_hidden_layers=4, head_dim=32, query_pre_attn_scalar=24, layer_types=types,
                sliding_window=WINDOW, tie_word_embeddings=True, **kw)


def _gemma2():
    from transformers import Gemma2Config

    # the tiny model's attention scores stay below 0.2: a cap of 0.05 bends them (Gemma 2's 50 would not)
    return Gemma2Config, _gemma(attn_logit_softcapping=0.05, final_logit_softcapping=30.0)


def _gemma3():
    from transformers import Gemma3TextConfig

    # Gemma 3 4B's rope: local theta 1e4, global theta 1e6 with linear scaling 8
    return Gemma3TextConfig, _gemma(rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}})


MOE = dict(COMMON, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)  # Qwen's field names


def _mixtral():
    from transformers import MixtralConfig

    return MixtralConfig, dict(COMMON, num_local_experts=8, num_experts_per_tok=2, intermediate_size=32,
                               tie_word_embeddings=False)


def _qwen2_moe():
    from transformers import Qwen2MoeConfig

    # a shared expert, norm_topk_prob off (Qwen1.5-MoE's) and layer 1 dense (mlp_only_layers)
    return Qwen2MoeConfig, dict(MOE, shared_expert_intermediate_size=48, mlp_only_layers=[1], tie_word_embeddings=False)


def _qwen3_moe():
    from transformers import Qwen3MoeConfig

    # top-4 (the sum over a token's experts has more than two terms), renormalised, head_dim != hidden / heads
    return Qwen3MoeConfig, dict(MOE, num_experts_per_tok=4, norm_topk_prob=True, head_dim=32, tie_word_embeddings=True)


MLA = dict(COMMON, num_key_value_heads=4, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
           tie_word_embeddings=False)
DEEPSEEK_MOE = dict(first_k_dense_replace=1, n_routed_experts=8, num_experts_per_tok=3, moe_intermediate_size=32,
                    n_group=4, topk_group=2, routed_scaling_factor=2.5)


def _deepseek_v2():
    from transformers import DeepseekV2Config

    # multi-head latent attention (q_lora_rank set), yarn with mscale; dense MLPs in every layer
    return DeepseekV2Config, dict(MLA, q_lora_rank=24, first_k_dense_replace=3,
                                  rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                                   "original_max_position_embeddings": 256, "beta_fast": 32,
                                                   "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.8})


def _deepseek_v2_moe():
    from transformers import DeepseekV2Config

    # V2-Lite's shape: no q_lora_rank, layer 0 dense, then routed + 2 shared experts (group-limited routing)
    return DeepseekV2Config, dict(MLA, q_lora_rank=None, n_shared_experts=2, topk_method="group_limited_greedy",
                                  **DEEPSEEK_MOE)


def _deepseek_v3():
    from transformers import DeepseekV3Config

    # sigmoid routing over groups, renormalised; interleaved rotary
    return DeepseekV3Config, dict(MLA, q_lora_rank=24, n_shared_experts=1, norm_topk_prob=True, rope_interleave=True,
                                  **DEEPSEEK_MOE)


FAMILIES: dict[str, Callable[[], tuple[type, dict[str, Any]]]] = {
    "llama": _llama,
    "mistral-window": _mistral_window,
    "qwen2": _qwen2,
    "qwen3": _qwen3,
    "phi3": _phi3,
    "deepseek_v2": _deepseek_v2,
    "deepseek_v2-moe": _deepseek_v2_moe,
    "deepseek_v3": _deepseek_v3,
    "gemma2": _gemma2,
    "gemma3": _gemma3,
    "mixtral": _mixtral,
    "qwen2_moe": _qwen2_moe,
    "qwen3_moe": _qwen3_moe,
}


def build_family(name: str, path: str, smol_dir: str, seed: int = 1):
    """Save family ``name``'s tiny random model (sharpened logits: greedy ties impossible) with
    SmolLM2's tokenizer in ``path``; return the transformers model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cls, kw = FAMILIES[name]()
    torch.manual_seed(seed)
    hf = AutoModelForCausalLM.from_config(cls(**kw)).eval()
    with torch.no_grad():
        hf.get_input_embeddings().weight.mul_(40.0)
        for n, p in hf.named_parameters():
            if n.endswith("bias") or "norm" in n:  # non-trivial biases and norm weights
                p.add_(torch.randn_like(p) * 0.3)
    hf.save_pretrained(path)
    AutoTokenizer.from_pretrained(smol_dir).save_pretrained(path)
    return hf
