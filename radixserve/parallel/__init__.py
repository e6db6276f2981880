"""Tensor and pipeline parallelism's groundwork, shared by the model and the worker.

Owns: ``group`` (``NoTP`` / ``DistTP``: all-reduce, vocab gather and plan send/recv; a dead peer
raises ``PeerLost``; every rank calls the same collectives in the same order), ``init`` (one
``torch.distributed`` rendezvous per rank: ``join``, ``rank_device``, ``free_loopback_addr``;
with ``pp_size > 1`` each stage's tensor-parallel group), ``layout.TPLayout`` (the heads, MLP
columns and vocab shard a rank holds, and the weight slicing that loads them), ``stage.PipeStage``
(the layers a pipeline stage holds, and the checkpoint tensors it loads) and ``p2p.StageLink``
(hidden states from stage to stage, step results from the last stage to world rank 0).
Must not touch: processes (``worker/tp`` spawns the ranks), models or requests; it imports only
``config`` (``model`` and ``worker`` build on it).
Modules are imported directly; nothing is re-exported here.
"""
