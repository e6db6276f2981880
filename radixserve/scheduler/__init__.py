"""Continuous batching: which requests run each step, and where their KV lives.

Owns: ``scheduler.Scheduler`` (``step()``: one extend or decode batch) and ``req.Req``;
``kv_manager.KVManager``, the only writer of the allocator, the prefix cache and the
request-to-token table (the slot invariant: ``mem_cache/invariants.py``), with its read-only
views for the stats and the inspector and warm restart's exchange with the tree in ``kv_views``;
``policy`` (queue order), ``admission``, ``preemption``, ``stop.StopChecker``; the grammar
manager's decisions applied (``grammar_steps``) and speculation's verdicts folded in
(``spec_steps``); ``lora_admin`` (LoRA adapters loaded and unloaded on the worker between steps,
and the ``max_loras_per_batch`` admission limit); ``pooling`` (embeddings), ``outputs``
(``ReqOutput`` deltas), ``plan`` (each step's ``StepReq``s), ``cache_persist`` (warm restart),
``build`` and the scheduler process (``process``); ``documents`` (order-free document reuse:
the internal requests that compute documents alone, placement after the exact match, each
step's window of computed and reused tokens).
Must not touch: KV tensors, weights or logits (the worker's, reached only through ``ipc``
messages -- ``StepPlan``s, and the warm-restart, tier and LoRA requests -- to an in-process
``ModelRunner`` or over ``worker.remote``); every method runs on the one thread that steps it.
It never imports ``engine``, ``server`` or ``detokenizer``.
Modules are imported directly; nothing is re-exported here.
"""
