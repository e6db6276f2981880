"""The scheduler process: the existing ``Scheduler`` driven over ZeroMQ.

With one rank the model runs in this process (``worker/local.LocalWorker``, loaded while the
tokenizer loads on a second thread); with several, rank 0 is a worker process reached through
``worker/remote.RemoteWorker``.  Both raise ``WorkerStepError`` for a failed step.

Loop contract:
- Requests, aborts and control messages from the server are drained before every step;
  a request the scheduler refuses gets a ``ReqError`` (400 invalid, 503 queue full), never
  an exception that escapes the loop.
- With work pending it steps back to back; idle, it blocks in ``zmq.Poller.poll`` with a
  timeout (no busy spinning).
- Control requests (``ControlReq``: stats, flush_cache, cache views, LoRA load/unload) run
  between steps and always get a ``ControlReply``; a refusal is ``{"error": ...}``.
- After each step it pushes one ``BatchReqOutput`` (token deltas) to the detokenizer, and
  at most every ``STATS_INTERVAL`` seconds a ``SchedulerStats``.
- A step the worker fails (``WorkerStepError``) aborts only the requests of that step,
  after returning the slots allocated for it.
- With ``cache_persist_dir`` (warm restart, ``scheduler/cache_persist.py``): the persisted
  prefixes are restored before the process reports ready, saved every
  ``cache_persist_interval`` s between steps, and the launcher's stop request
  (``radixserve.proc.on_stop``) ends the loop after the current step (within ``IDLE_POLL_MS``
  when idle) and saves them before the process exits.  Without it the stop request ends the
  process at once.
"""
from __future__ import annotations

import dataclasses
import gc
import logging
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

import zmq

from radixserve.config import EngineConfig
from radixserve.ipc.server_link import (AbortReq, BatchReqOutput, ControlReply, ControlReq, ReqError,
                                        SchedulerStats, TokenizedRequest)
from radixserve.ipc.zmq_utils import IPCAddrs, drain, make_socket, send_obj
from radixserve.proc import on_stop, setup_child
from radixserve.scheduler.build import build_scheduler, new_req
from radixserve.scheduler.cache_persist import CachePersister
from radixserve.scheduler.outputs import take_output
from radixserve.scheduler.req import Req
from radixserve.worker.local import LocalWorker
from radixserve.worker.remote import RemoteWorker, WorkerStepError

logger = logging.getLogger(__name__)

IDLE_POLL_MS = 1000
INVARIANT_CHECK_MAX_SLOTS = 1 << 18  # the full memory check walks every slot: only by default on small pools
STATS_INTERVAL = 0.5


class SchedulerLoop:
    def __init__(self, cfg: EngineConfig, addrs: IPCAddrs, ctx: zmq.Context) -> None:
        from radixserve.tokenizer import load_light_tokenizer

        self.from_server = make_socket(ctx, zmq.PULL, addrs.server_to_sched, bind=True)
        self.to_detok = make_socket(ctx, zmq.PUSH, addrs.sched_to_detok, bind=False)
        if cfg.parallel.world_size == 1:
            with ThreadPoolExecutor(1) as pool:  # the tokenizer loads while the model does
                tokenizer_f = pool.submit(load_light_tokenizer, cfg.model.tokenizer_path or cfg.model.path)
                self.worker: Any = LocalWorker.build(cfg)
                tokenizer = tokenizer_f.result()
        else:
            self.worker = RemoteWorker(ctx, addrs)
            tokenizer = load_light_tokenizer(cfg.model.tokenizer_path or cfg.model.path)  # while the worker loads
        self.info = self.worker.wait_ready()
        self.sched = build_scheduler(cfg, self.worker, self.info, tokenizer, self.worker)
        self.finished: list[Req] = []
        self.sched.hooks.append(self.finished.append)
        self.last_stats = 0.0
        self.stopping = False  # set by the stop request when the cache is persisted: leave the loop, then save
        self.persister: Optional[CachePersister] = None
        if cfg.cache.persists:
            self.persister = CachePersister(self.sched.kv, self.worker, cfg.cache, self.info.kv_bytes_per_slot)
            self.persister.restore()  # before the launcher hears we are ready

    # ------------------------------------------------------------------ messages
    def handle(self, msg: Any) -> None:
        if isinstance(msg, TokenizedRequest):
            self.add(msg)
        elif isinstance(msg, AbortReq):
            self.sched.abort(msg.rid, msg.message)
        elif isinstance(msg, ControlReq):
            try:
                payload = self.control(msg.kind, msg.args)
            except Exception as e:  # a reply always goes back: the server never waits out its timeout
                logger.error("control %r failed:\n%s", msg.kind, traceback.format_exc())
                payload = {"error": f"control {msg.kind}: {type(e).__name__}: {e}"}
            send_obj(self.to_detok, ControlReply(msg.req_id, payload))
        else:
            logger.warning("ignoring unknown message %r", type(msg).__name__)

    def add(self, msg: TokenizedRequest) -> None:
        req = new_req(msg)  # validated and clamped by the server's RequestBuilder
        req.arrival = time.perf_counter()
        try:
            self.sched.add_request(req)
        except ValueError as e:
            send_obj(self.to_detok, ReqError(msg.rid, 400, str(e)))
        except OverflowError as e:
            send_obj(self.to_detok, ReqError(msg.rid, 503, f"{e}; retry later"))
        except Exception as e:  # never let one request take the scheduler down
            logger.error("add_request failed:\n%s", traceback.format_exc())
            send_obj(self.to_detok, ReqError(msg.rid, 500, f"internal error: {type(e).__name__}: {e}"))

    def control(self, kind: str, args: Optional[dict[str, Any]] = None) -> Any:
        args = args or {}
        if kind == "flush_cache":
            return self.sched.flush_cache()
        if kind == "cache_tree":
            return self.sched.kv.cache_tree(int(args.get("max_depth", 8)), int(args.get("max_nodes", 200)),
                                            bool(args.get("with_tokens", False)))
        if kind == "cache_stats":
            s = self.sched.kv.cache_stats()
            s["requests"] = {"running": len(self.sched.running), "waiting": len(self.sched.waiting)}
            return s
        if kind in ("stats", "stats+check"):
            s = self.sched.stats()
            s["held_slots"] = s["num_slots"] - s["free_slots"] - s["cache_size"]  # held by running requests
            s["worker_steps"] = self.worker.num_steps
            s["invariants_ok"] = s["invariant_error"] = None
            if kind == "stats+check" or s["num_slots"] <= INVARIANT_CHECK_MAX_SLOTS:
                try:
                    self.sched.check_invariants()
                    s["invariants_ok"] = True
                except AssertionError as e:
                    s["invariants_ok"], s["invariant_error"] = False, str(e)
            return s
        if kind in ("load_lora", "unload_lora"):
            return self.lora_control(kind, args)
        return {"error": f"unknown control request {kind!r}"}

    def lora_control(self, kind: str, args: dict[str, Any]) -> dict[str, Any]:
        """``load_lora`` (name, path) -> ``{"adapter": AdapterInfo as a dict}``; ``unload_lora``
        (uid) -> ``{"requests_in_flight": n}`` (the weights go when those are done).  A refusal is
        ``{"error": "<field>: ...", "status": 400}``.  Plain dicts: the detokenizer, which forwards
        the reply, never imports the LoRA modules."""
        try:
            if kind == "load_lora":
                return {"adapter": dataclasses.asdict(self.sched.lora.load(str(args["name"]), str(args["path"])))}
            return {"requests_in_flight": self.sched.lora.unload(str(args["uid"]), self.sched.lora_users)}
        except ValueError as e:
            return {"error": str(e), "status": 400}

    # ------------------------------------------------------------------ stepping
    def step(self) -> list[Req]:
        try:
            return self.sched.step()
        except WorkerStepError as e:
            self.fail_plan(e.plan.reqs, f"internal error in the model worker: {e}")
        except Exception as e:
            logger.error("scheduler step failed:\n%s", traceback.format_exc())
            for req in list(self.sched.running):
                self.sched.abort(req.rid, f"internal error: {type(e).__name__}: {e}")
        return []

    def fail_plan(self, step_reqs: list, message: str) -> None:
        """Abort the requests of a failed step, first freeing the slots allocated for it."""
        by_rid = {r.rid: r for r in self.sched.running}
        for sr in step_reqs:
            req = by_rid.get(sr.rid)
            if req is not None and not req.finished:
                self.sched.kv.free_tail(req, len(sr.input_ids))
                self.sched.abort(req.rid, message)

    def emit(self, touched: list[Req], step_start: float) -> None:
        reqs = {r.rid: r for r in self.finished}
        reqs.update({r.rid: r for r in touched})
        self.finished.clear()
        outs = [o for o in (take_output(r, step_start) for r in reqs.values()) if o is not None]
        if outs:
            send_obj(self.to_detok, BatchReqOutput(outs))

    def maybe_send_stats(self) -> None:
        now = time.monotonic()
        if now - self.last_stats < STATS_INTERVAL:
            return
        self.last_stats = now
        s = self.sched.stats()
        send_obj(self.to_detok, SchedulerStats(s["running"], s["waiting"], s["num_slots"], s["free_slots"],
                                               s["cache_size"], s["hit_rate"]))

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.from_server, zmq.POLLIN)
        while not self.stopping:
            timeout = 0 if self.sched.has_work() else IDLE_POLL_MS
            if poller.poll(timeout):
                for msg in drain(self.from_server):
                    try:
                        self.handle(msg)
                    except Exception:
                        logger.error("message handling failed:\n%s", traceback.format_exc())
            step_start = time.perf_counter()
            touched = self.step() if self.sched.has_work() else []
            self.emit(touched, step_start)
            self.maybe_send_stats()
            if self.persister is not None:
                self.persist(final=False)
        if self.persister is not None:
            self.persist(final=True)

    def persist(self, final: bool) -> None:
        """Save the hottest prefixes (at shutdown, or when the interval is up); a failure is
        logged, never raised: serving goes on without it."""
        try:
            if final:
                self.persister.save(wait=True)
            else:
                self.persister.maybe_save()
        except Exception:
            logger.error("persisting the prefix cache failed:\n%s", traceback.format_exc())


def run_scheduler(cfg: EngineConfig, log_level: str, addrs: IPCAddrs, ready_conn, parent_pid: int) -> None:
    """Process entry point (spawned by the launcher)."""
    setup_child("scheduler", log_level, parent_pid)
    loop = SchedulerLoop(cfg, addrs, zmq.Context())
    if loop.persister is not None:  # the stop request ends the loop after the current step; then the save
        on_stop(lambda: setattr(loop, "stopping", True))
    ready_conn.send(loop.info)
    ready_conn.close()
    # what start-up built lives as long as the process: out of the collector's sight, a full
    # collection (e.g. during a grammar compile) no longer walks the tokenizer's and config's objects
    gc.collect()
    gc.freeze()
    loop.run()
