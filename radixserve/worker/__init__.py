"""The model worker: weights, KV tensors, attention and sampling, in-process or as its own process.

Owns: ``model_runner.ModelRunner`` (``step(StepPlan) -> StepResult``), ``kv_setup`` (``build_kv``:
the runner's ``KVSetup`` -- the ``KVPool`` in its form, its own request->token tables and the
attention backend over them; ``build_tier_store`` / ``build_prefix_store`` for the tiers and warm
restart), ``kv_sizing`` (``kv_layout``: the pool's slots, and a sliding-window model's second
pool), ``sampler.Sampler`` (batched logits processing and sampling), ``pooling``
(embeddings), ``doc_kv`` (a reused document's KV copied into a request's slots with its keys
moved to their new positions), ``doc_select`` (which reused document tokens a step recomputes: the first, or those
whose layer-1 KV deviates most), ``build`` (``build_worker``: the runner from an ``EngineConfig``), ``local.LocalWorker``
(one rank's runner inside the scheduler process), ``process`` (rank 0's worker process when there are several
ranks) and ``remote.RemoteWorker`` (the scheduler's handle on that process).
Subpackages: ``tuning`` (choices by timing and accuracy), ``tp`` (tensor-parallel ranks), ``pp``
(pipeline-parallel stages and micro-batches), ``spec`` (draft model, verification), ``persist``
(warm restart's KV file), ``tiers`` (the hierarchical cache's host buffers and disk blocks) and
``lora`` (the adapters' host pool and slots, and each step's LoRA products).
Must not touch: scheduling -- which requests run, slot allocation and the prefix tree are the
scheduler's; the worker writes KV only into the slots the scheduler names (a plan, a tier move,
a restore).  It never imports ``scheduler``, ``engine`` or ``server``; ``process`` and
``remote`` import the model only inside functions (the scheduler imports them).
Modules are imported directly; nothing is re-exported here.
"""
