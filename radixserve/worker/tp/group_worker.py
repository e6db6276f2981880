"""The in-process Engine's tensor-parallel worker: every rank in a child process.

With ``tp_size > 1`` the Engine does not load the model itself: ``start_group`` spawns rank
0's worker process (the server's ``worker/process.py``, which broadcasts plans) and this
node's other ranks, and returns a ``GroupWorker`` -- a ``RemoteWorker`` (same ``step`` as
``ModelRunner``) over a private ipc directory -- with the ``WorkerInfo`` rank 0 reports.  So
the caller's process never joins a ``torch.distributed`` group (several Engines may live in
one process), and the Engine's scheduler is the unchanged one.  A rank that dies makes the
next ``step`` raise ``WorkerDied`` (the Engine fails its pending requests); ``close`` stops
every rank.  The ranks exit when the Engine's process dies.
"""
from __future__ import annotations

import os
import shutil
import tempfile

import zmq

from radixserve.config import EngineConfig
from radixserve.ipc.worker_link import WorkerInfo
from radixserve.ipc.zmq_utils import IPCAddrs
from radixserve.worker.remote import RemoteWorker
from radixserve.worker.tp.group import RankProcs, start_followers, start_worker, with_rendezvous

STARTUP_GRACE_S = 600.0  # loading, on top of the rendezvous timeout


class GroupWorker(RemoteWorker):
    def __init__(self, cfg: EngineConfig, log_level: str = "warning") -> None:
        if cfg.parallel.node_rank != 0:
            raise ValueError("node_rank: the Engine runs node 0; start the other nodes with "
                             "`radixserve serve --node-rank K`")
        cfg = with_rendezvous(cfg)
        self.ipc_dir = tempfile.mkdtemp(prefix="radixserve-tp-")
        addrs = IPCAddrs.in_dir(self.ipc_dir)
        self.ctx = zmq.Context()
        self.ranks = RankProcs({})
        super().__init__(self.ctx, addrs, dead=self.ranks.dead)
        try:
            procs = {"worker": start_worker(cfg, log_level, addrs, os.getpid())}
            procs.update(start_followers(cfg, log_level, os.getpid()))
            self.ranks.add(procs)
            self.ranks.wait_ready(cfg.parallel.dist_timeout + STARTUP_GRACE_S)
            self.info = self.wait_ready()  # rank 0 sent it before reporting ready
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stop every rank; idempotent."""
        self.ranks.stop()
        self.ctx.destroy(linger=0)
        shutil.rmtree(self.ipc_dir, ignore_errors=True)


def start_group(cfg: EngineConfig) -> tuple[GroupWorker, WorkerInfo]:
    """Spawn the ranks and wait until rank 0 reports its ``WorkerInfo`` (RuntimeError if a rank
    exits first)."""
    from radixserve.worker.build import check_config

    check_config(cfg)  # fail here, in the caller's thread, not in a child
    worker = GroupWorker(cfg)
    return worker, worker.info
