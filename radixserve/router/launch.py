"""Run the router (``radixserve router``) and data-parallel serving (``serve --dp-size N``).

``serve_dp`` starts N replica servers (``radixserve serve`` with the same flags, each on a
free loopback port, each with cores / N threads unless OMP_NUM_THREADS is set), waits
until every one is healthy, then runs the router on the public host and port in this
process.  A replica that exits is restarted (with a growing pause);
the router's health checks take it out of rotation meanwhile and back when it is up.  On
SIGINT/SIGTERM the router stops, then the replicas (SIGTERM, then SIGKILL after 15 s).
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Optional

import httpx

from radixserve.config import RouterConfig, ServerConfig
from radixserve.proc import configure_logging

logger = logging.getLogger("radixserve.router")


def run_router(cfg: RouterConfig, urls: list[str]) -> int:
    """Serve the router until stopped; returns the exit code."""
    import uvicorn

    from radixserve.router.app import Router, create_router_app

    configure_logging(cfg.log_level, "router")
    try:
        router = Router(cfg, urls)
    except ValueError as e:
        logger.error("cannot start: worker-urls: %s", e)
        return 2
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    server = uvicorn.Server(uvicorn.Config(create_router_app(router), host=cfg.host, port=cfg.port,
                                           log_level=cfg.log_level.lower(), timeout_graceful_shutdown=2))
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    return 0 if server.started else 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ReplicaProcess:
    """One ``radixserve serve`` child on a loopback port, restarted when it exits."""

    def __init__(self, argv: list[str], index: int, threads: Optional[int] = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [sys.executable, "-m", "radixserve.cli", "serve", *argv, "--host", "127.0.0.1",
                    "--port", str(self.port), "--dp-size", "1"]
        self.index = index
        self.env = dict(os.environ)
        if threads is not None and "OMP_NUM_THREADS" not in os.environ:
            self.env["OMP_NUM_THREADS"] = str(threads)  # the replicas share this machine's cores
        self.proc: Optional[subprocess.Popen] = None
        self.restarts = 0

    def start(self) -> None:
        self.proc = subprocess.Popen(self.cmd, env=self.env, preexec_fn=_die_with_parent)
        logger.info("replica %d (pid %d) starting on %s", self.index, self.proc.pid, self.url)

    def healthy(self) -> bool:
        try:
            return httpx.get(self.url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()


def _die_with_parent() -> None:  # in the child before exec: SIGTERM when this process dies
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


def _supervise(replicas: list[ReplicaProcess], stopping: threading.Event) -> None:
    while not stopping.wait(1.0):
        for r in replicas:
            if r.proc is not None and r.proc.poll() is not None and not stopping.is_set():
                pause = min(30.0, 2.0 ** r.restarts)
                logger.error("replica %d exited with code %s; restarting in %.0f s", r.index, r.proc.returncode, pause)
                if stopping.wait(pause):
                    return
                r.restarts += 1
                r.start()


def serve_dp(argv: list[str], server_cfg: ServerConfig, startup_timeout: float = 900.0) -> int:
    """Run ``server_cfg.dp_size`` replicas behind the cache-aware router on ``server_cfg``'s port."""
    configure_logging(server_cfg.log_level, "router")
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    threads = max(1, (os.cpu_count() or 1) // server_cfg.dp_size)
    replicas = [ReplicaProcess(argv, i, threads) for i in range(server_cfg.dp_size)]
    stopping = threading.Event()
    try:
        for r in replicas:
            r.start()
        deadline = time.monotonic() + startup_timeout
        while not all(r.healthy() for r in replicas):
            dead = [r for r in replicas if r.proc is not None and r.proc.poll() is not None]
            if dead or time.monotonic() > deadline:
                logger.error("replica %d %s during startup", (dead or replicas)[0].index,
                             f"exited with code {dead[0].proc.returncode}" if dead else "was not ready in time")
                return 1
            time.sleep(0.5)
        threading.Thread(target=_supervise, args=(replicas, stopping), daemon=True).start()
        cfg = RouterConfig(host=server_cfg.host, port=server_cfg.port, api_key=server_cfg.api_key,
                           log_level=server_cfg.log_level)
        return run_router(cfg, [r.url for r in replicas])
    except KeyboardInterrupt:
        return 0
    finally:
        stopping.set()
        for r in replicas:
            r.stop()
        for r in replicas:
            if r.proc is not None:
                try:
                    r.proc.wait(15)
                except subprocess.TimeoutExpired:
                    os.kill(r.proc.pid, signal.SIGKILL)
