"""A tensor-parallel rank other than 0: joins the group, loads its shard, runs every plan.

(Under pipeline parallelism every rank but world rank 0 runs here too: its runner, a
``worker/pp/runner.PipelineRunner``, does its stage's part of each plan.)

It has no link to the scheduler: rank 0 (``worker/process.py``) broadcasts each step plan
and returns the results.  The rank exits with code 1 when a collective fails (rank 0 or
another rank is gone, or ``dist_timeout`` passed without a plan or keep-alive), on its
launcher's stop request, and like every child when the process that started it dies
(``radixserve.proc``; it ignores SIGINT/SIGTERM).
"""
from __future__ import annotations

import logging
import os
import traceback

from radixserve.config import EngineConfig
from radixserve.proc import setup_child

logger = logging.getLogger(__name__)


def run_follower(cfg: EngineConfig, log_level: str, rank: int, ready_conn, parent_pid: int) -> None:
    """Process entry point (spawned by ``worker/tp/group.py``)."""
    setup_child(f"tp{rank}", log_level, parent_pid)
    from radixserve.parallel.group import PeerLost
    from radixserve.parallel.init import join
    from radixserve.worker.build import build_worker
    from radixserve.worker.model_runner import resolve_device

    try:
        tp = join(cfg.parallel, rank, resolve_device(cfg.model.device))
        runner, _ = build_worker(cfg, show_progress=False, tp=tp)
        logger.info("tensor-parallel rank %d of %d ready", rank, tp.size)
        ready_conn.send(rank)
        ready_conn.close()
        while True:
            plan = tp.recv()
            if plan is None:  # keep-alive
                continue
            try:
                runner.step(plan)
            except Exception:  # as on rank 0, which reports the error of the same step
                logger.error("step failed:\n%s", traceback.format_exc())
    except PeerLost as e:
        logger.error("tensor-parallel rank %d lost its group (%s); exiting", rank, e)
        logging.shutdown()
        os._exit(1)  # at once: the group's teardown at exit would wait on the dead peer
