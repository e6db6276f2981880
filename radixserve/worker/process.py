"""The model worker process: owns weights, KV tensors, attention and sampling.

Protocol (over two PUSH/PULL links with the scheduler): first the worker sends one
``WorkerInfo`` once the model is loaded; then, for every ``StepPlan`` it receives, it sends
exactly one reply, a ``StepResult`` or a ``WorkerError`` when the step raised (the worker
keeps serving; the scheduler fails the requests of that step).  With ``cache_persist_dir``,
``KVSaveReq``/``KVRestoreReq`` (``ipc/persist_link.py``) are answered the same way, between steps.
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

    from radixserve.ipc.persist_link import KVRestoreReq, KVSaveReq
    from radixserve.worker.build import build_prefix_store, build_worker  # here: the scheduler imports this module

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
    store = build_prefix_store(cfg, runner, info)
    while True:
        msg = recv_obj(plans)
        try:
            if isinstance(msg, KVSaveReq) and store is not None:
                reply = store.save_prefixes(msg)
            elif isinstance(msg, KVRestoreReq) and store is not None:
                reply = store.restore_prefixes(msg)
            else:
                reply = runner.step(msg)
        except Exception as e:  # one bad step must not take the worker down
            logger.error("step failed:\n%s", traceback.format_exc())
            reply = WorkerError(f"{type(e).__name__}: {e}")
        send_obj(results, reply)
