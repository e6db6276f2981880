"""Launch the runtime: model worker, scheduler and detokenizer processes plus the HTTP
server in this process (with ``tp_size > 1`` also this node's other tensor-parallel ranks,
watched like the other children; a node with ``node_rank > 0`` runs only its ranks:
``server/follower_node.py``).

Contract: ``serve`` starts the children (multiprocessing "spawn"), waits until each says
it is ready, then runs uvicorn.  If a child dies at any time, /health turns 503, pending
requests fail, the other children are stopped and ``serve`` returns 1 within seconds.
On a normal stop (SIGINT/SIGTERM) the children are stopped in order (scheduler, worker,
detokenizer) and ``serve`` returns 0.  Children watch this process and exit if it dies.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import multiprocessing as mp
import multiprocessing.connection
import os
import shutil
import signal
import tempfile
import threading
import time
from typing import Any

from radixserve.config import EngineConfig, ServerConfig
from radixserve.ipc.zmq_utils import IPCAddrs
from radixserve.proc import configure_logging

logger = logging.getLogger("radixserve.server")


# Entry points import their module only in the child, so this process never loads them.
def _worker_entry(*args: Any) -> None:
    from radixserve.worker.process import run_worker
    run_worker(*args)


def _scheduler_entry(*args: Any) -> None:
    from radixserve.scheduler.process import run_scheduler
    run_scheduler(*args)


def _detokenizer_entry(*args: Any) -> None:
    from radixserve.detokenizer.process import run_detokenizer
    run_detokenizer(*args)


class ChildDied(RuntimeError):
    pass


PERSIST_GRACE_S = 120.0  # at most this long for the scheduler's final save of the prefix cache


class Launcher:
    ORDER = ("scheduler", "worker", "detokenizer")  # shutdown order

    def __init__(self, cfg: EngineConfig, log_level: str) -> None:
        self.cfg = cfg
        self.log_level = log_level
        self.ipc_dir = tempfile.mkdtemp(prefix="radixserve-ipc-")
        self.addrs = IPCAddrs.in_dir(self.ipc_dir)
        self.procs: dict[str, mp.Process] = {}
        self.conns: dict[str, Any] = {}
        self.exit_code = 0
        self._lock = threading.Lock()

    def start(self) -> None:
        from radixserve.worker.tp.group import start_followers

        for name, (p, conn) in start_followers(self.cfg, self.log_level, os.getpid()).items():
            self.procs[name], self.conns[name] = p, conn
        ctx = mp.get_context("spawn")
        entries = {"worker": _worker_entry, "scheduler": _scheduler_entry, "detokenizer": _detokenizer_entry}
        for name, entry in entries.items():
            recv, send = ctx.Pipe(duplex=False)
            p = ctx.Process(target=entry, name=f"radixserve-{name}", daemon=True,
                            args=(self.cfg, self.log_level, self.addrs, send, os.getpid()))
            p.start()
            send.close()
            self.procs[name], self.conns[name] = p, recv

    def wait_ready(self) -> dict[str, Any]:
        """Block until every child reported ready; raises ChildDied if one exits first."""
        infos: dict[str, Any] = {}
        while len(infos) < len(self.procs):
            pending = [n for n in self.procs if n not in infos]
            waitables = [self.conns[n] for n in pending] + [self.procs[n].sentinel for n in pending]
            ready = multiprocessing.connection.wait(waitables, timeout=1.0)
            for n in pending:
                p, conn = self.procs[n], self.conns[n]
                if conn in ready or p.sentinel in ready:
                    try:
                        infos[n] = conn.recv()
                        logger.info("%s process ready (pid %d)", n, p.pid)
                    except (EOFError, OSError):
                        p.join(10)
                        raise ChildDied(f"{n} process exited with code {p.exitcode} during startup") from None
        return infos

    def dead_child(self) -> str | None:
        for name, p in self.procs.items():
            if p.exitcode is not None:
                return f"{name} process exited with code {p.exitcode}"
        return None

    def shutdown(self) -> None:
        """Stop the children in order (SIGTERM, then SIGKILL after 3 s, or after
        ``PERSIST_GRACE_S`` for the scheduler when it persists the prefix cache on SIGTERM and
        the worker, which writes the file and is stopped after it, is alive); idempotent."""
        with self._lock:
            for name in [*self.ORDER, *(n for n in self.procs if n not in self.ORDER)]:
                p = self.procs.get(name)
                if p is None or p.exitcode is not None:
                    continue
                p.terminate()
                p.join(PERSIST_GRACE_S if name == "scheduler" and self._saves_on_stop() else 3)
                if p.exitcode is None:
                    p.kill()
                    p.join(1)
            shutil.rmtree(self.ipc_dir, ignore_errors=True)

    def _saves_on_stop(self) -> bool:
        """The scheduler persists the prefix cache on SIGTERM (it needs a live worker)."""
        worker = self.procs.get("worker")
        return self.cfg.cache.persists and worker is not None and worker.exitcode is None

    async def watch(self, tm: Any, server: Any) -> None:
        """Poll the children; on the first death fail everything and stop the server."""
        while True:
            await asyncio.sleep(0.2)
            reason = self.dead_child()
            if reason is None:
                continue
            logger.error("%s; shutting down", reason)
            self.exit_code = 1
            tm.fail_all(reason)
            await asyncio.sleep(0.1)  # let failed requests get their answers
            await asyncio.to_thread(self.shutdown)
            logger.info("child processes stopped")
            server.should_exit = True
            timer = threading.Timer(8.0, os._exit, args=(1,))  # never hang on a stuck connection
            timer.daemon = True
            timer.start()
            return


def model_name(path: str | None) -> str:
    return os.path.basename(path.rstrip("/")).removesuffix(".gguf") if path else "SmolLM2-135M-Instruct"


def serve(engine_cfg: EngineConfig, server_cfg: ServerConfig) -> int:
    """Run the server until stopped; returns the process exit code."""
    import uvicorn

    from radixserve.tokenizer import load_light_tokenizer
    from radixserve.server.tenancy.accounting import Accounting, StartupError, open_accounting
    from radixserve.server.app import ServerContext, create_app
    from radixserve.server.tenancy.budget import Ledger
    from radixserve.server.tokenizer_manager import TokenizerManager

    configure_logging(server_cfg.log_level, "server")
    try:
        keys, usage_db = open_accounting(server_cfg)  # a bad keys file stops here, before any child starts
    except StartupError as e:
        logger.error("cannot start: %s", e)
        return 2
    if keys is not None:  # until the event loop takes SIGHUP over, so a reload during start-up never kills us
        signal.signal(signal.SIGHUP, lambda *_: keys.reload())
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # SIGTERM behaves like Ctrl-C: uvicorn captures both while it runs and re-raises them
    # when it stops; with the default SIGTERM action that would kill this process before it
    # stops the children in order
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    t0 = time.perf_counter()
    hf_dir = engine_cfg.model.path
    if not (hf_dir and os.path.isdir(hf_dir)):  # the loader imports torch: only when a GGUF needs converting
        from radixserve.model.loader import resolve_hf_dir

        hf_dir = resolve_hf_dir(hf_dir, show_progress=True)  # converts a GGUF once, here
    cfg = dataclasses.replace(engine_cfg, model=dataclasses.replace(engine_cfg.model, path=hf_dir))
    if cfg.parallel.node_rank > 0:
        from radixserve.server.follower_node import serve_ranks

        if usage_db is not None:
            usage_db.close()
        return serve_ranks(cfg, server_cfg.log_level)
    from radixserve.worker.tp.group import with_rendezvous

    launcher = Launcher(with_rendezvous(cfg), server_cfg.log_level)
    try:
        launcher.start()
        tokenizer_path = cfg.model.tokenizer_path or hf_dir
        tokenizer = load_light_tokenizer(tokenizer_path)
        logger.info("loading the model in the worker process...")
        info = launcher.wait_ready()["scheduler"]
        logger.info("model ready in %.1fs: %s, %s (quantization %s) on %s, %d KV slots, context %d",
                    time.perf_counter() - t0, hf_dir, info.dtype, info.quantization, info.device, info.num_slots - 1,
                    info.context_len)
        tm = TokenizerManager(tokenizer, info, launcher.addrs, tokenizer_path, engine_cfg.scheduler.grammar_backend)
        if usage_db is not None:
            tm.accounting = Accounting(Ledger(usage_db), tm.metrics, keys)
        ctx = ServerContext(tm, engine_cfg, server_cfg, model_name(engine_cfg.model.path),
                            engine_cfg.model.path or hf_dir, tokenizer_path,
                            {n: p.pid for n, p in launcher.procs.items()} | {"server": os.getpid()}, keys)
        app = create_app(ctx)
        server = uvicorn.Server(uvicorn.Config(app, host=server_cfg.host, port=server_cfg.port,
                                               log_level=server_cfg.log_level.lower(), timeout_graceful_shutdown=2))

        async def main() -> None:
            tasks = [asyncio.create_task(tm.recv_loop()), asyncio.create_task(launcher.watch(tm, server))]
            tm.chat.preload()
            if keys is not None:  # SIGHUP re-reads the keys file (a bad one keeps the old keys)
                asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, keys.reload)
            try:
                await server.serve()
            finally:
                for t in tasks:
                    t.cancel()

        asyncio.run(main())
        if not server.started and launcher.exit_code == 0:
            launcher.exit_code = 1  # e.g. the port was taken
    except ChildDied as e:
        logger.error("%s", e)
        launcher.exit_code = 1
    except KeyboardInterrupt:
        pass
    finally:
        launcher.shutdown()
        if usage_db is not None:
            usage_db.close()
    return launcher.exit_code
