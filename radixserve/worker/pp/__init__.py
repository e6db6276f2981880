"""Pipeline-parallel workers: a step's micro-batches through the stages.

Owns: ``micro`` (``split_plan``: a step plan cut into micro-batches by requests),
``runner.PipelineRunner`` (the ``step`` every rank of a pipeline runs: its stage's part of
each micro-batch, and on world rank 0 the results gathered from the last stage) and ``checks``
(``check_pipeline``: what pipeline parallelism refuses at startup, naming the flag).
Must not touch: the collectives and point-to-point links (``radixserve.parallel``), the
processes (``worker/tp`` starts every rank, pipeline or not) or scheduling.
Modules are imported directly; nothing is re-exported here.
"""
