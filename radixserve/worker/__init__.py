"""The model worker: weights, KV tensors, attention and sampling, in-process or as its own process.

Owns: ``model_runner.ModelRunner`` (``step(StepPlan) -> StepResult``; the ``KVPool`` and its own
request->token table), ``sampler.Sampler`` (batched logits processing and sampling), ``pooling``
(embeddings), ``build`` (``build_worker``: the runner from an ``EngineConfig``), ``process``
(the worker process) and ``remote.RemoteWorker`` (the scheduler's handle on that process).
Subpackages: ``tuning`` (choices by timing and accuracy), ``tp`` (tensor-parallel ranks),
``spec`` (draft model, verification) and ``persist`` (warm restart's KV file).
Must not touch: scheduling -- which requests run, slot allocation and the prefix tree are the
scheduler's; the worker writes KV only into the slots a plan names.  It never imports
``scheduler``, ``engine`` or ``server``; ``process`` and ``remote`` import the model only inside
functions (the scheduler imports them).
Modules are imported directly; nothing is re-exported here.
"""
