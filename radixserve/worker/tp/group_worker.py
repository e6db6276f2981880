"""The in-process Engine's tensor-parallel worker: every rank in a child process.

With ``tp_size > 1`` (or ``pp_size > 1``: every stage's ranks) the Engine does not load the
model itself: ``start_group`` spawns rank 0's worker process (the server's
``worker/process.py``, which broadcasts plans) and this node's other ranks, and returns a
``GroupWorker`` -- a ``RemoteWorker`` (same ``step`` as ``ModelRunner``) over a private ipc
directory -- with the ``WorkerInfo`` rank 0 reports.  So the caller's process never joins a
``torch.distributed`` group (several Engines may live in one process), and the Engine's
scheduler is the unchanged one.  A rank that dies makes the
next ``step`` raise ``WorkerDied`` (the Engine fails its pending requests); ``close`` stops
every rank (``radixserve.proc.Supervisor``; they also stop at interpreter exit).  The ranks
ignore SIGINT/SIGTERM (a Ctrl-C is the caller's to handle) and exit when the Engine's process dies.
"""
from __future__ import annotations

import shutil
import tempfile
from typing import Optional

import zmq

from radixserve.config import EngineConfig
from radixserve.ipc.worker_link import WorkerInfo
from radixserve.ipc.zmq_utils import IPCAddrs
from radixserve.proc import Supervisor
from radixserve.worker.remote import RemoteWorker
from radixserve.worker.tp.group import start_followers, start_worker, with_rendezvous

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
        self.ranks = Supervisor()
        super().__init__(self.ctx, addrs, dead=self.dead_rank)
        try:
            start_worker(self.ranks, cfg, log_level, addrs)
            start_followers(self.ranks, cfg, log_level)
            self.ranks.wait_ready(cfg.parallel.dist_timeout + STARTUP_GRACE_S)
            self.info = self.wait_ready()  # rank 0 sent it before reporting ready
        except BaseException:
            self.close()
            raise

    def dead_rank(self) -> Optional[str]:
        """How the first rank that exited did, else None."""
        dead = self.ranks.dead()
        return None if dead is None else str(dead)

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
