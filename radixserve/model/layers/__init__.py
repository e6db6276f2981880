"""The layers the families are built from.

- ``decoder``: ``DecoderLM`` / ``DecoderLayer`` / ``Attention``, the decoder-only LM every family
  specialises, over ``ForwardBatch`` and an attention backend
- ``norm_mlp``: RMSNorm, the gated MLP and the activation helpers
- ``rotary``: rotary embeddings (every scaling variant, one cos/sin table)
- ``moe``: the sparse mixture-of-experts block (router, grouped experts, shared expert)
- ``moe_decoder``: ``MoEDecoderLM``, the decoder whose layers hold ``moe.SparseMoE``, and the
  per-expert checkpoint stacking
- ``mla``: multi-head latent attention (DeepSeek) over the paged pool
- ``lm_head``: the LM head (tied or own, quantized and packed variants, soft-capping)
- ``tp``: the vocab-parallel embedding of a tensor-parallel rank
- ``weights``: loading Hugging Face-named tensors (q/k/v and gate/up fused at load time)
"""
