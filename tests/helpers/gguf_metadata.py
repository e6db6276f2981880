"""The ``{arch}.*`` metadata llama.cpp's ``convert_hf_to_gguf.py`` writes for each family
(``TextModel.set_gguf_parameters`` and the family class's additions), for
tests/helpers/gguf_writer.py: common sizes, rope base and scaling (Llama 3.1's goes in as a
tensor instead), experts, Phi-3's rotary dimensions and LongRoPE attention factor, Gemma's
soft-capping and window, DeepSeek-V2's MLA ranks written as MQA (one KV head)."""
from __future__ import annotations

import math
from typing import Any

import gguf


def write_metadata(w: gguf.GGUFWriter, arch: str, cfg: Any, hparams: dict) -> None:
    """The ``{arch}.*`` keys llama.cpp's TextModel and the family's class write."""
    rope = getattr(cfg, "rope_parameters", None) or {}
    rope = rope.get("full_attention", rope)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(1 if arch == "deepseek2" else cfg.num_key_value_heads)  # MLA as MQA
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    if "rope_theta" in rope:
        w.add_rope_freq_base(rope["rope_theta"])
    if rope.get("rope_type") in ("linear", "yarn"):
        w.add_rope_scaling_type(gguf.RopeScalingType(rope["rope_type"]))
        w.add_rope_scaling_factor(rope["factor"])
    if rope.get("rope_type") == "yarn":
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        if rope.get("mscale_all_dim"):
            w.add_rope_scaling_yarn_log_mul(0.1 * rope["mscale_all_dim"])
    if hparams.get("num_local_experts"):
        w.add_expert_count(hparams["num_local_experts"])
    if hparams.get("num_experts_per_tok"):
        w.add_expert_used_count(hparams["num_experts_per_tok"])
    if hparams.get("head_dim") is not None and arch != "deepseek2":
        w.add_key_length(hparams["head_dim"])
        w.add_value_length(hparams["head_dim"])
    if arch == "llama":
        w.add_vocab_size(cfg.vocab_size)
        w.add_rope_dimension_count(hparams.get("head_dim") or cfg.hidden_size // cfg.num_attention_heads)
    elif arch == "phi3":
        _phi3_metadata(w, cfg, rope)
    elif arch.startswith("gemma"):
        if getattr(cfg, "attn_logit_softcapping", None):
            w.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
        if getattr(cfg, "final_logit_softcapping", None):
            w.add_final_logit_softcapping(cfg.final_logit_softcapping)
        w.add_sliding_window(cfg.sliding_window)
    elif arch in ("qwen2moe", "qwen3moe"):
        if not hparams.get("num_local_experts"):
            w.add_expert_count(cfg.num_experts)
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
        if arch == "qwen2moe":
            w.add_expert_shared_feed_forward_length(cfg.shared_expert_intermediate_size)
    elif arch == "deepseek2":
        _deepseek2_metadata(w, cfg)


def _phi3_metadata(w: gguf.GGUFWriter, cfg: Any, rope: dict) -> None:
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    w.add_rope_dimension_count(int(rope.get("partial_rotary_factor", 1.0) * head_dim))
    orig = rope.get("original_max_position_embeddings", getattr(cfg, "original_max_position_embeddings", None))
    w.add_rope_scaling_orig_ctx_len(orig)
    w.add_sliding_window(getattr(cfg, "sliding_window", None) or 0)
    if rope.get("rope_type") == "longrope":
        scale = cfg.max_position_embeddings / orig
        w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1 else 1.0)


def _deepseek2_metadata(w: gguf.GGUFWriter, cfg: Any) -> None:
    w.add_vocab_size(cfg.vocab_size)
    w.add_leading_dense_block_count(cfg.first_k_dense_replace)
    if cfg.q_lora_rank is not None:
        w.add_q_lora_rank(cfg.q_lora_rank)
    w.add_kv_lora_rank(cfg.kv_lora_rank)
    w.add_key_length(cfg.kv_lora_rank + cfg.qk_rope_head_dim)
    w.add_value_length(cfg.kv_lora_rank)
    w.add_key_length_mla(cfg.qk_nope_head_dim + cfg.qk_rope_head_dim)
    w.add_value_length_mla(cfg.v_head_dim)
    w.add_rope_dimension_count(cfg.qk_rope_head_dim)
    w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    w.add_expert_count(cfg.n_routed_experts)
    w.add_expert_shared_count(cfg.n_shared_experts)
    w.add_expert_weights_scale(cfg.routed_scaling_factor)
    w.add_expert_weights_norm(bool(cfg.norm_topk_prob))
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SOFTMAX)
    if cfg.n_group:
        w.add_expert_group_count(cfg.n_group)
        w.add_expert_group_used_count(cfg.topk_group)
