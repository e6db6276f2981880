"""Choices made by measuring this machine once, then cached under ``$RADIXSERVE_CACHE``.

Owns: ``numerics_choice`` (``resolve_numerics`` -> ``Numerics``: dtype, quantization, packed
dense weights; explicit settings and a pinned ``dense_kernel`` are taken as given),
``kernel_timing`` (every linear path timed on the model's shapes), ``quant_accuracy`` (a
quantization's argmax agreement with fp32 against a confidence bar), ``attention_timing``
(which extend blocks the CPU backend gives to flash attention) and ``json_cache`` (their files).
Must not touch: a loaded model or a running step -- it returns choices that ``ModelRunner``
applies, and only ``worker.model_runner`` imports it; a cache that cannot be read or written
never fails a start.  Tests inject timers or pin the choice; none may depend on what this
machine's timing picks.
Modules are imported directly; nothing is re-exported here.
"""
