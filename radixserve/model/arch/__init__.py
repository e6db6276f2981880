"""The model families, one module each; ``registry`` imports every module here, so a new family
is one new file whose class carries ``@register("model_type", ...)``.

- ``llama``: Llama 2/3, SmolLM2, Mistral and Qwen 2 (``DecoderLM`` as it is)
- ``qwen3``: Qwen 3 dense (per-head q/k norms, explicit ``head_dim``)
- ``phi3``: Phi-3 and Phi-4-mini (fused checkpoint projections split, partial rotary, LongRoPE)
- ``gemma``: Gemma 2 and Gemma 3 text (scaled embeddings, ``1 + w`` norms, soft-capping, sliding windows)
- ``mixtral``: Mixtral (sparse experts in every layer)
- ``qwen_moe``: Qwen2-MoE and Qwen3-MoE (shared expert, dense layers)
- ``deepseek_v2``: DeepSeek-V2/V2-Lite and V3 (latent attention, grouped routing, shared experts)
"""
