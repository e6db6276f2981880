"""A Hugging Face config from a GGUF file's metadata, read as llama.cpp writes it.

``hf_config(meta, shapes, data)`` maps the ``{arch}.*`` keys (``gguf.Keys``) every
architecture shares to config fields, then the family's own: Mixtral is ``llama`` with experts;
Phi-3's partial rotary and LongRoPE factors (stored as ``rope_factors_*`` tensors); Gemma's
soft-capping, sliding windows and the query scale llama.cpp derives from the layer count;
the experts of the Qwen MoE families; DeepSeek-V2's MLA ranks (stored as MQA).  A file of
another architecture, or with a feature this does not read, raises ValueError naming it:
never a config that would run a different model.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
from gguf import Keys

MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "phi3": "phi3", "gemma2": "gemma2",
               "gemma3": "gemma3_text", "qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "deepseek2": "deepseek_v2"}
COMMON = {Keys.LLM.CONTEXT_LENGTH: "max_position_embeddings", Keys.LLM.EMBEDDING_LENGTH: "hidden_size",
          Keys.LLM.BLOCK_COUNT: "num_hidden_layers", Keys.LLM.FEED_FORWARD_LENGTH: "intermediate_size",
          Keys.Attention.HEAD_COUNT: "num_attention_heads", Keys.Attention.HEAD_COUNT_KV: "num_key_value_heads",
          Keys.Attention.LAYERNORM_RMS_EPS: "rms_norm_eps", Keys.Attention.KEY_LENGTH: "head_dim",
          Keys.Attention.SLIDING_WINDOW: "sliding_window", Keys.LLM.VOCAB_SIZE: "vocab_size",
          Keys.LLM.EXPERT_USED_COUNT: "num_experts_per_tok",
          Keys.LLM.EXPERT_FEED_FORWARD_LENGTH: "moe_intermediate_size"}
TOKEN_IDS = {Keys.Tokenizer.BOS_ID: "bos_token_id", Keys.Tokenizer.EOS_ID: "eos_token_id",
             Keys.Tokenizer.UNK_ID: "unk_token_id", Keys.Tokenizer.PAD_ID: "pad_token_id"}
TensorData = Callable[[str], np.ndarray]


def hf_config(meta: dict[str, Any], shapes: dict[str, tuple[int, ...]], data: TensorData) -> Any:
    """The transformers config of a GGUF file: ``meta`` its key/values, ``shapes`` its tensors'
    shapes (PyTorch order), ``data(name)`` a tensor's values (for metadata stored as tensors)."""
    from transformers import AutoConfig

    arch = meta["general.architecture"]
    if arch not in MODEL_TYPES:
        raise ValueError(f"model: GGUF architecture {arch!r} is not supported "
                         f"(supported: {', '.join(sorted(MODEL_TYPES))})")
    get = _getter(meta, arch)
    kw: dict[str, Any] = {field: get(key) for key, field in COMMON.items() if get(key) is not None}
    kw.update({field: meta[key] for key, field in TOKEN_IDS.items() if key in meta})
    kw["tie_word_embeddings"] = "output.weight" not in shapes
    kw.setdefault("vocab_size", shapes["token_embd.weight"][0])
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": get(Keys.Rope.FREQ_BASE) or 10000.0}
    model_type = MODEL_TYPES[arch]
    model_type = _FAMILY.get(arch, _plain)(get, kw, rope, shapes, data) or model_type
    if "rope_parameters" not in kw:
        kw["rope_parameters"] = _scaled(get, rope, arch)
    return AutoConfig.for_model(model_type, **kw)


def short_float(x: Any) -> float:
    """A float32 as the shortest decimal that reads back the same (1e-06, not 9.99999997e-07)."""
    return float(str(np.float32(x)))


def _getter(meta: dict[str, Any], arch: str) -> Callable[[str], Any]:
    return lambda key: meta.get(key.format(arch=arch))


def _scaled(get: Callable[[str], Any], rope: dict[str, Any], arch: str) -> dict[str, Any]:
    """``rope`` with the file's linear or YaRN scaling (``rope.scaling.*``)."""
    kind = get(Keys.Rope.SCALING_TYPE)
    if kind in (None, "none"):
        return rope
    if kind not in ("linear", "yarn"):
        raise ValueError(f"model: GGUF architecture {arch!r} with rope scaling {kind!r} is not supported")
    out = dict(rope, rope_type=kind, factor=get(Keys.Rope.SCALING_FACTOR))
    if kind == "yarn":  # llama.cpp's defaults: beta_fast 32, beta_slow 1
        out.update(original_max_position_embeddings=get(Keys.Rope.SCALING_ORIG_CTX_LEN),
                   beta_fast=get(Keys.Rope.SCALING_YARN_BETA_FAST) or 32.0,
                   beta_slow=get(Keys.Rope.SCALING_YARN_BETA_SLOW) or 1.0)
        if get(Keys.Rope.SCALING_YARN_LOG_MUL):  # llama.cpp writes 0.1 * mscale_all_dim
            out["mscale"] = out["mscale_all_dim"] = round(get(Keys.Rope.SCALING_YARN_LOG_MUL) * 10, 6)
    return out


def _head_dim(get, kw, shapes) -> int:
    """``attention.key_length``, else Llama's ``rope.dimension_count``, else the K rows per head."""
    return kw.get("head_dim") or get(Keys.Rope.DIMENSION_COUNT) or \
        shapes["blk.0.attn_k.weight"][0] // kw["num_key_value_heads"]


def _plain(get, kw, rope, shapes, data) -> None:
    """Qwen 2/3: the common keys (head_dim from the tensors when the file omits it)."""
    kw["head_dim"] = _head_dim(get, kw, shapes)


def llama3_rope_factors(rope: dict[str, Any], head_dim: int) -> list[float]:
    """The per-frequency divisors llama.cpp stores as ``rope_freqs`` for Llama 3.1's rope
    (``LlamaModel.generate_extra_tensors``, float32 as there)."""
    import math

    import torch

    freqs = 1.0 / (rope["rope_theta"] ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    factor, old = rope["factor"], rope["original_max_position_embeddings"]
    low, high = rope["low_freq_factor"], rope["high_freq_factor"]
    out = []
    for freq in freqs.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return out


def _llama3(rope: dict[str, Any], stored: np.ndarray, head_dim: int) -> dict[str, Any]:
    """Llama 3.1's rope parameters behind a ``rope_freqs`` tensor: Meta's low/high frequency
    factors (1, 4) and 8192 original positions, with the largest stored factor; ValueError when
    they do not give the stored factors back."""
    out = dict(rope, rope_type="llama3", factor=float(stored.max()), low_freq_factor=1.0, high_freq_factor=4.0,
               original_max_position_embeddings=8192)
    if not np.allclose(llama3_rope_factors(out, head_dim), stored, rtol=1e-5):
        raise ValueError("model: GGUF architecture 'llama' with rope_freqs other than Llama 3.1's rope "
                         "(low/high frequency factors 1/4, 8192 original positions) is not supported")
    return out


def _llama(get, kw, rope, shapes, data) -> str:
    """Llama (Llama 3.1's rope from ``rope_freqs``), Mistral (``llama`` with a sliding window) and
    Mixtral (``llama`` with experts)."""
    kw["head_dim"] = _head_dim(get, kw, shapes)
    if "rope_freqs.weight" in shapes:
        kw["rope_parameters"] = _llama3(rope, data("rope_freqs.weight"), kw["head_dim"])
    if get(Keys.LLM.EXPERT_COUNT):
        kw["num_local_experts"] = get(Keys.LLM.EXPERT_COUNT)
        return "mixtral"
    return "mistral" if kw.get("sliding_window") else "llama"


def _phi3(get, kw, rope, shapes, data) -> None:
    """Phi-3 / Phi-4-mini: rotary over ``rope.dimension_count`` of each head, LongRoPE factors."""
    kw.pop("head_dim", None)
    head_dim = kw["hidden_size"] // kw["num_attention_heads"]
    kw["partial_rotary_factor"] = (get(Keys.Rope.DIMENSION_COUNT) or head_dim) / head_dim
    kw["sliding_window"] = kw.get("sliding_window") or None  # llama.cpp writes 0 for none
    orig = get(Keys.Rope.SCALING_ORIG_CTX_LEN)
    if orig:
        kw["original_max_position_embeddings"] = orig
    if "rope_factors_long.weight" in shapes:
        kw["rope_parameters"] = dict(rope, rope_type="longrope",
                                     long_factor=[short_float(x) for x in data("rope_factors_long.weight")],
                                     short_factor=[short_float(x) for x in data("rope_factors_short.weight")])


def _gemma(get, kw, rope, shapes, data) -> None:
    """Gemma 2/3: llama.cpp stores no query scale; like llama.cpp, 1/sqrt(hidden/heads) for the
    27B models (46 or 62 layers), 1/sqrt(head_dim) otherwise."""
    layers, big = kw["num_hidden_layers"], kw["num_hidden_layers"] in (46, 62)
    kw["head_dim"] = _head_dim(get, kw, shapes)
    kw["query_pre_attn_scalar"] = kw["hidden_size"] // kw["num_attention_heads"] if big else kw["head_dim"]
    for key, field in ((Keys.LLM.ATTN_LOGIT_SOFTCAPPING, "attn_logit_softcapping"),
                       (Keys.LLM.FINAL_LOGIT_SOFTCAPPING, "final_logit_softcapping")):
        if get(key) is not None:
            kw[field] = get(key)
    if get(Keys.General.ARCHITECTURE) != "gemma3":
        return
    pattern = get(Keys.Attention.SLIDING_WINDOW_PATTERN)
    if isinstance(pattern, list):  # one flag per layer (true: sliding)
        kw["layer_types"] = ["sliding_attention" if p else "full_attention" for p in pattern]
    else:  # every n-th layer full; llama.cpp's gemma3 has n = 6 and writes no key
        n = kw["sliding_window_pattern"] = pattern or 6
        kw["layer_types"] = ["full_attention" if (i + 1) % n == 0 else "sliding_attention" for i in range(layers)]
    local = {"rope_type": "default", "rope_theta": get(Keys.Rope.FREQ_BASE_SWA) or 10000.0}
    kw["rope_parameters"] = {"full_attention": _scaled(get, rope, "gemma3"), "sliding_attention": local}


def _qwen_moe(get, kw, rope, shapes, data) -> None:
    """Qwen2-MoE (shared expert, no top-k renormalization) and Qwen3-MoE (renormalized, as
    llama.cpp computes it)."""
    _plain(get, kw, rope, shapes, data)
    kw["num_experts"] = get(Keys.LLM.EXPERT_COUNT)
    if get(Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH) is not None:
        kw["shared_expert_intermediate_size"] = get(Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH)
    kw["norm_topk_prob"] = get(Keys.General.ARCHITECTURE) == "qwen3moe"
    kw.update(decoder_sparse_step=1, mlp_only_layers=[])


def _deepseek2(get, kw, rope, shapes, data) -> None:
    """DeepSeek-V2: MLA written as MQA (``head_count_kv`` 1, ``key_length`` = kv rank + rope)."""
    rope_dim = get(Keys.Rope.DIMENSION_COUNT)
    key_mla, value_mla = get(Keys.Attention.KEY_LENGTH_MLA), get(Keys.Attention.VALUE_LENGTH_MLA)
    kw.pop("head_dim", None)
    kw.update(num_key_value_heads=kw["num_attention_heads"], q_lora_rank=get(Keys.Attention.Q_LORA_RANK) or None,
              kv_lora_rank=get(Keys.Attention.KV_LORA_RANK), qk_rope_head_dim=rope_dim,
              qk_nope_head_dim=(key_mla or get(Keys.Attention.KEY_LENGTH)) - rope_dim,
              v_head_dim=value_mla or get(Keys.Attention.VALUE_LENGTH),
              n_routed_experts=get(Keys.LLM.EXPERT_COUNT), n_shared_experts=get(Keys.LLM.EXPERT_SHARED_COUNT) or 0,
              first_k_dense_replace=get(Keys.LLM.LEADING_DENSE_BLOCK_COUNT) or 0,
              routed_scaling_factor=get(Keys.LLM.EXPERT_WEIGHTS_SCALE) or 1.0,
              norm_topk_prob=bool(get(Keys.LLM.EXPERT_WEIGHTS_NORM)))
    if get(Keys.LLM.EXPERT_GATING_FUNC) not in (None, 1):  # 1: softmax, DeepSeek-V2's
        raise ValueError("model: GGUF architecture 'deepseek2' with sigmoid expert gating is not supported")
    if (get(Keys.LLM.EXPERT_GROUP_COUNT) or 1) > 1:
        kw.update(n_group=get(Keys.LLM.EXPERT_GROUP_COUNT), topk_group=get(Keys.LLM.EXPERT_GROUP_USED_COUNT),
                  topk_method="group_limited_greedy")


_FAMILY = {"llama": _llama, "phi3": _phi3, "gemma2": _gemma, "gemma3": _gemma, "qwen2moe": _qwen_moe,
           "qwen3moe": _qwen_moe, "deepseek2": _deepseek2}
