"""The Llama-family model and its weights, as the model worker runs them.

Owns: ``llama.LlamaForCausalLM`` over the paged KV pool (building blocks in ``layers.py``, the
vocab-parallel embedding in ``tp_layers.py``), ``loader`` (HF directory or GGUF file -> model;
``$RADIXSERVE_CACHE``), the linear-layer kinds the numerics choose from (``quant.QuantLinear``
with ``calibration``, ``blocked``, ``packed_linear.PackedLinear``, the int8 LM head of
``quant_head``) and the CPU step's fast paths (``fused_ops``, ``layer_loop``, ``layer_stack``),
which must stay bit-identical to the module path (tests/core/test_layer_loop.py).
Must not touch: requests, scheduling, sampling or the numerics choice (``worker/tuning`` decides
and the worker passes it in); K/V is written only through the attention backend.  It imports
``attention``, ``parallel``, ``kernels``, ``mem_cache.kv_pool`` and ``tokenizer``, never
``speculative``, ``worker`` or ``scheduler``.
Modules are imported directly; nothing is re-exported here.
"""
