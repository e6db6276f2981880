"""``radixserve serve --nnodes N --node-rank K`` with K > 0: this node's tensor- and
pipeline-parallel ranks only (no scheduler, no HTTP server).

Contract: starts the ranks ``ParallelConfig.local_ranks()`` (``radixserve.proc.Supervisor``)
and waits.  Returns 1 as soon as one of them exits (rank 0's node went away, a collective
failed or timed out, or loading failed), after stopping the others; returns 0 on the first
SIGINT/SIGTERM, to this process or its whole process group (the ranks ignore both; later
ones are ignored too, ``radixserve.proc.StopSignals``).  The ranks exit if this process dies.
"""
from __future__ import annotations

import logging
import time

from radixserve.config import EngineConfig
from radixserve.proc import StopSignals, Supervisor, configure_logging
from radixserve.worker.tp.group import start_followers

logger = logging.getLogger("radixserve.node")

STARTUP_GRACE_S = 600.0  # loading the shard, on top of the rendezvous timeout


def serve_ranks(cfg: EngineConfig, log_level: str) -> int:
    par = cfg.parallel
    configure_logging(log_level, f"node{par.node_rank}")
    stops = StopSignals().install()
    ranks = Supervisor()
    try:
        start_followers(ranks, cfg, log_level)
        ranks.wait_ready(par.dist_timeout + STARTUP_GRACE_S)
        logger.info("node %d of %d: ranks %s ready (rank 0 at %s)", par.node_rank, par.nnodes,
                    list(par.local_ranks()), par.dist_init_addr)
        while (dead := ranks.dead()) is None:
            time.sleep(0.2)
        logger.error("%s; shutting down this node", dead)
        return 1
    except RuntimeError as e:
        logger.error("%s", e)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        stops.begin()
        ranks.stop()
