"""Tensor-parallel worker groups: starting and watching the processes of the ranks.

Owns: ``group`` (``start_followers``, ``start_worker``, ``with_rendezvous``, ``RankProcs``;
no torch import: the server process uses it), ``follower.run_follower`` (a rank other than 0:
joins the group, loads its shard, runs every plan rank 0 sends) and ``group_worker``
(``start_group`` / ``GroupWorker``: the Engine's TP worker, every rank in a child process).
Must not touch: the collectives and the weight layout (``radixserve.parallel``) or scheduling;
only rank 0 samples and answers the scheduler.
Modules are imported directly; nothing is re-exported here.
"""
