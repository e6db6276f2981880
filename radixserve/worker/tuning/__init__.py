"""Choices made by measuring once (this machine's timings, a model's accuracy), then cached under
``$RADIXSERVE_CACHE``.

Owns: ``numerics_choice`` (``resolve_numerics`` -> ``Numerics``: dtype, quantization, packed
dense weights; explicit settings and a pinned ``dense_kernel`` are taken as given),
``kernel_timing`` (every linear path timed on the model's shapes), ``quant_accuracy`` (a
quantization's argmax agreement with fp32 against a confidence bar), ``kv_accuracy`` (the same
bar for a lossy KV pool form, ``--kv-cache-dtype``, against the exact pool; a form that misses
it is refused at startup), ``attention_timing`` (which extend blocks the CPU backend gives to
flash attention, and over a bf16 pool whether its kernel uses AVX512-BF16 dot products),
``noise`` (when a timing is plainly noisy: retaken, and never cached as it is) and
``json_cache`` (their files).
Must not touch: a running step or a loaded model's weights -- it returns choices that the
worker applies (``kv_accuracy`` only runs the loaded model's forwards).  Only ``worker`` imports
it (``model_runner`` and ``kv_setup``; ``lora.timing`` reuses ``json_cache`` and
``kernel_timing``'s timer and CPU signature).  A cache that cannot be read or written never
fails a start.  Tests inject timers or pin the choice; none may depend on what this machine's
timing picks.
Modules are imported directly; nothing is re-exported here.
"""
