"""The model worker process: owns weights, KV tensors, attention and sampling.

Protocol (over two PUSH/PULL links with the scheduler): first the worker sends one
``WorkerInfo`` once the model is loaded; then, for every ``StepPlan`` it receives, it sends
exactly one reply, a ``StepResult`` or a ``WorkerError`` when the step raised (the worker
keeps serving; the scheduler fails the requests of that step).  With ``cache_persist_dir``,
``KVSaveReq``/``KVRestoreReq`` (``ipc/persist_link.py``) are answered the same way, between steps,
and with the hierarchical cache ``KVTierReq`` (``ipc/tier_link.py``).

With ``tp_size > 1`` (or ``pp_size > 1``) this process is rank 0 of the tensor-parallel group
(of stage 0 of the pipeline, its runner a ``worker/pp/runner.PipelineRunner``): it broadcasts each
plan to the other ranks (``worker/tp/follower.py``) before stepping it, and a keep-alive
after every ``KEEPALIVE_S`` idle seconds, so that a dead rank is noticed while idle too; a
failed collective (``PeerLost``) ends this process with exit code 1, which takes the
server down as any dead worker does.  (Warm restart is refused with several ranks.)

Like every child (``radixserve.proc.setup_child``) it ignores SIGINT/SIGTERM: the launcher
stops it after the scheduler's final save, and it exits when the launcher dies.
"""
from __future__ import annotations

import logging
import os
import threading
import traceback
from dataclasses import dataclass
from typing import Any

import zmq

from radixserve.config import EngineConfig
from radixserve.ipc.zmq_utils import IPCAddrs, make_socket, recv_obj, send_obj
from radixserve.proc import setup_child

logger = logging.getLogger(__name__)

KEEPALIVE_S = 1.0


@dataclass
class WorkerError:
    message: str


def run_worker(cfg: EngineConfig, log_level: str, addrs: IPCAddrs, ready_conn, parent_pid: int) -> None:
    """Process entry point (spawned by the launcher)."""
    setup_child("worker", log_level, parent_pid)
    from tqdm import tqdm

    from radixserve.parallel.group import PeerLost
    from radixserve.parallel.init import join
    from radixserve.worker.build import build_worker  # here: the scheduler imports this module
    from radixserve.worker.kv_setup import build_prefix_store, build_tier_store
    from radixserve.worker.model_runner import resolve_device

    tqdm.set_lock(threading.RLock())  # not tqdm's default multiprocessing lock: a killed process would leak it
    try:
        tp = join(cfg.parallel, 0, resolve_device(cfg.model.device))
        runner, info = build_worker(cfg, tp=tp)
        logger.info("model loaded from %s: %s (quantization %s) on %s, %d KV slots", info.hf_dir, info.dtype,
                    info.quantization, info.device, info.num_slots)
        ctx = zmq.Context()
        plans = make_socket(ctx, zmq.PULL, addrs.sched_to_worker, bind=True)
        results = make_socket(ctx, zmq.PUSH, addrs.worker_to_sched, bind=False)
        send_obj(results, info)
        ready_conn.send(info)
        ready_conn.close()
        if tp.world_size == 1:
            serve(runner, build_prefix_store(cfg, runner, info), plans, results, build_tier_store(cfg, runner, info))
        else:
            serve_tp(runner, tp, plans, results)
    except PeerLost as e:
        logger.error("tensor-parallel rank lost (%s); exiting", e)
        logging.shutdown()
        os._exit(1)  # at once: the group's teardown at exit would wait on the dead peer


def _step(runner: Any, plan: Any, store: Any = None, tiers: Any = None) -> Any:
    from radixserve.ipc.lora_link import LoRAReq
    from radixserve.ipc.persist_link import KVRestoreReq, KVSaveReq
    from radixserve.ipc.tier_link import KVTierReq

    try:
        if isinstance(plan, LoRAReq):
            return runner.lora_request(plan)
        if isinstance(plan, KVTierReq) and tiers is not None:
            return tiers.apply_tiers(plan)
        if isinstance(plan, KVSaveReq) and store is not None:
            return store.save_prefixes(plan)
        if isinstance(plan, KVRestoreReq) and store is not None:
            return store.restore_prefixes(plan)
        return runner.step(plan)
    except Exception as e:  # one bad step must not take the worker down
        logger.error("step failed:\n%s", traceback.format_exc())
        return WorkerError(f"{type(e).__name__}: {e}")


def serve(runner: Any, store: Any, plans: zmq.Socket, results: zmq.Socket, tiers: Any = None) -> None:
    while True:
        send_obj(results, _step(runner, recv_obj(plans), store, tiers))


def serve_tp(runner: Any, tp: Any, plans: zmq.Socket, results: zmq.Socket) -> None:
    """Rank 0's loop: every plan goes to every rank first; idle, a keep-alive each second."""
    while True:
        if not plans.poll(int(KEEPALIVE_S * 1000)):
            tp.send(None)
            continue
        plan = recv_obj(plans)
        tp.send(plan)
        send_obj(results, _step(runner, plan))
