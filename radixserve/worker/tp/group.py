"""Starting the processes of a tensor-parallel worker group (no torch import here: the
server process uses this module).

``with_rendezvous(cfg)`` fills in a free loopback ``dist_init_addr`` for a one-node group.
``start_worker`` adds rank 0's worker process (``worker/process.py``: the HTTP launcher's
model worker, also with ``tp_size == 1``) to a ``radixserve.proc.Supervisor``, and
``start_followers`` this node's ranks other than 0 (``worker/tp/follower.py``); each reports
ready on its pipe once loaded.  The supervisor's owner (the HTTP launcher, the node-1
launcher ``server/follower_node.py``, the in-process Engine's ``GroupWorker``) waits for,
watches and stops them.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from radixserve.config import EngineConfig
from radixserve.proc import Supervisor


# Entry points import their module only in the child, so the parent never loads torch.
def _follower_entry(*args: Any) -> None:
    from radixserve.worker.tp.follower import run_follower
    run_follower(*args)


def _worker_entry(*args: Any) -> None:
    from radixserve.worker.process import run_worker
    run_worker(*args)


def with_rendezvous(cfg: EngineConfig) -> EngineConfig:
    """``cfg`` with a free ``127.0.0.1:PORT`` rendezvous when it runs TP or PP on one node without one."""
    par = cfg.parallel
    if par.world_size == 1 or par.dist_init_addr:
        return cfg
    from radixserve.parallel.init import free_loopback_addr

    return dataclasses.replace(cfg, parallel=dataclasses.replace(par, dist_init_addr=free_loopback_addr()))


def follower_name(rank: int) -> str:
    return f"tp-rank{rank}"


def start_followers(sup: Supervisor, cfg: EngineConfig, log_level: str) -> list[str]:
    """Spawn this node's ranks other than 0 under ``sup``; their names."""
    names = []
    for rank in cfg.parallel.local_ranks():
        if rank != 0:
            names.append(follower_name(rank))
            sup.start(names[-1], _follower_entry, cfg, log_level, rank)
    return names


def start_worker(sup: Supervisor, cfg: EngineConfig, log_level: str, addrs: Any) -> None:
    """Spawn rank 0's worker process, named "worker", under ``sup`` (it reports its ``WorkerInfo``)."""
    sup.start("worker", _worker_entry, cfg, log_level, addrs)
