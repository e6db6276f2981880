"""Attention over the paged KV pool: the one ``AttentionBackend`` a model worker steps with.

Owns: the backend contract and the per-step ``ForwardBatch`` (``base.py``: the KV pool and
req_to_token layouts every backend and kernel share), the factory that alone knows every
backend (``registry.create_attention_backend``) and the backends: ``cpu_backend.CpuBackend``
(the native kernel; its per-step work plan in ``cpu_plan.py``), ``torch_native.TorchNativeBackend``
(shared prefixes through ``cascade.py``), ``triton_backend.TritonBackend`` and
``flashinfer_backend.FlashInferBackend`` (CUDA).
Must not touch: slot bookkeeping -- a backend reads req_to_token and writes K/V only into the
slots of the step's new tokens (``out_cache_loc``; slot 0 takes padding), never the allocator,
the prefix tree or the table.  It imports only ``radixserve.kernels`` and ``mem_cache.kv_pool``
(never ``model``, ``worker`` or ``scheduler``, which build on it).
Modules are imported directly; nothing is re-exported here.
"""
