"""The models the worker runs: ten families over the paged KV pool, their shared layers, the
linear-layer kinds the numerics choose from, checkpoint loading and the CPU step's fast path.

- ``registry``: ``model_type`` -> class, the one table of architectures; it finds the families by
  importing every module of ``arch/``
- ``arch/``: one module per family (Llama/Mistral/Qwen 2, Qwen 3, Phi-3, Gemma 2/3, Mixtral,
  Qwen-MoE, DeepSeek-V2/V3), each registered once with ``registry.register``
- ``layers/``: what the families share: the decoder (``DecoderLM``), norms and MLPs, rotary, MoE
  and MoE decoders, latent attention, the LM head, the tensor-parallel embedding, weight loading
- ``quant/``: the linear-layer kinds (int8/w8a8/int4, the blocked low-bit layout, oneDNN-packed
  dense weights, the int8 LM head) and the calibration texts the accuracy gate uses
- ``gguf/``: a GGUF file's metadata -> a Hugging Face config, and the file -> a HF directory
- ``cpu/``: the CPU step's fast path (fused elementwise ops, the flat layer loop, the native layer
  stack), which must stay equal to the module path (tests/core/test_layer_loop.py)
- ``loader``: HF directory or GGUF file -> a loaded model (``$RADIXSERVE_CACHE``)
- ``hub``: a Hugging Face Hub id (``ORG/NAME[:QUANT]``) -> a local directory or GGUF file, fetched
  through ``huggingface_hub`` once, by the process that starts the others; each failure one line
- ``config_snapshot``: a config read once with transformers, kept as plain values so that later
  starts (the worker, every rank) read it without importing transformers

Must not touch: requests, scheduling, sampling or the numerics choice (``worker/tuning`` decides
and the worker passes it in); K/V is written only through the attention backend.  It imports
``attention``, ``parallel``, ``kernels``, ``mem_cache.kv_pool`` and ``tokenizer``, never
``speculative``, ``worker`` or ``scheduler``.  Modules are imported directly; nothing is
re-exported here.
"""
