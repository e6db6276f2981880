"""The model worker process: owns weights, KV tensors, attention and sampling.

Protocol (over two PUSH/PULL links with the scheduler): first the worker sends one
``WorkerInfo`` once the model is loaded; then, for every ``StepPlan`` it receives, it sends
exactly one reply, a ``StepResult`` or a ``WorkerError`` when the step raised (the worker
keeps serving; the scheduler fails the requests of that step).
"""
from __future__ import annotations

import logging
import threading
import traceback
from dataclasses import dataclass

import zmq

from radixserve.config import EngineConfig
from radixserve.ipc.zmq_utils import IPCAddrs, make_socket, recv_obj, send_obj
from radixserve.proc import setup_child

logger = logging.getLogger(__name__)


@dataclass
class WorkerError:
    message: str


def run_worker(cfg: EngineConfig, log_level: str, addrs: IPCAddrs, ready_conn, parent_pid: int) -> None:
    """Process entry point (spawned by the launcher)."""
    setup_child("worker", log_level, parent_pid)
    from tqdm import tqdm

    from radixserve.worker.build import build_worker  # here: the scheduler imports this module too

    tqdm.set_lock(threading.RLock())  # not tqdm's default multiprocessing lock: SIGTERM would leak it
    runner, info = build_worker(cfg)
    logger.info("model loaded from %s: %s (quantization %s) on %s, %d KV slots", info.hf_dir, info.dtype,
                info.quantization, info.device, info.num_slots)
    ctx = zmq.Context()
    plans = make_socket(ctx, zmq.PULL, addrs.sched_to_worker, bind=True)
    results = make_socket(ctx, zmq.PUSH, addrs.worker_to_sched, bind=False)
    send_obj(results, info)
    ready_conn.send(info)
    ready_conn.close()
    while True:
        plan = recv_obj(plans)
        try:
            reply = runner.step(plan)
        except Exception as e:  # one bad step must not take the worker down
            logger.error("step failed:\n%s", traceback.format_exc())
            reply = WorkerError(f"{type(e).__name__}: {e}")
        send_obj(results, reply)
