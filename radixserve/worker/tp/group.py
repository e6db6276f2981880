"""Starting the processes of a tensor-parallel worker group (no torch import here: the
server process uses this module).

``with_rendezvous(cfg)`` fills in a free loopback ``dist_init_addr`` for a one-node group.
``start_followers`` spawns this node's ranks other than 0 (``worker/tp/follower.py``); each
reports its rank on its pipe once loaded.  ``RankProcs`` waits for and watches such a set of
processes (the node-1 launcher and the in-process Engine use it; the HTTP launcher keeps
them in its own table).
"""
from __future__ import annotations

import dataclasses
import multiprocessing as mp
import multiprocessing.connection
from typing import Any, Callable

from radixserve.config import EngineConfig


def _follower_entry(*args: Any) -> None:
    from radixserve.worker.tp.follower import run_follower
    run_follower(*args)


def _worker_entry(*args: Any) -> None:
    from radixserve.worker.process import run_worker
    run_worker(*args)


def with_rendezvous(cfg: EngineConfig) -> EngineConfig:
    """``cfg`` with a free ``127.0.0.1:PORT`` rendezvous when it runs TP on one node without one."""
    par = cfg.parallel
    if par.tp_size == 1 or par.dist_init_addr:
        return cfg
    from radixserve.parallel.init import free_loopback_addr

    return dataclasses.replace(cfg, parallel=dataclasses.replace(par, dist_init_addr=free_loopback_addr()))


def follower_name(rank: int) -> str:
    return f"tp-rank{rank}"


def start_followers(cfg: EngineConfig, log_level: str, parent_pid: int) -> dict[str, tuple[Any, Any]]:
    """Spawn this node's ranks other than 0; name -> (process, ready pipe)."""
    ctx = mp.get_context("spawn")
    out = {}
    for rank in cfg.parallel.local_ranks():
        if rank == 0:
            continue
        recv, send = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_follower_entry, name=f"radixserve-{follower_name(rank)}", daemon=True,
                        args=(cfg, log_level, rank, send, parent_pid))
        p.start()
        send.close()
        out[follower_name(rank)] = (p, recv)
    return out


def start_worker(cfg: EngineConfig, log_level: str, addrs: Any, parent_pid: int) -> tuple[Any, Any]:
    """Spawn rank 0's worker process (``worker/process.py``); (process, ready pipe)."""
    ctx = mp.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_worker_entry, name="radixserve-worker", daemon=True,
                    args=(cfg, log_level, addrs, send, parent_pid))
    p.start()
    send.close()
    return p, recv


class RankProcs:
    """A set of named child processes, each with a pipe it sends one object on when ready."""

    def __init__(self, procs: dict[str, tuple[Any, Any]] | None = None) -> None:
        self.procs: dict[str, Any] = {}
        self.conns: dict[str, Any] = {}
        self.add(procs or {})

    def add(self, procs: dict[str, tuple[Any, Any]]) -> None:
        """Take over ``name -> (process, ready pipe)``."""
        for name, (p, conn) in procs.items():
            self.procs[name], self.conns[name] = p, conn

    def wait_ready(self, timeout: float, alive: Callable[[], bool] = lambda: True) -> dict[str, Any]:
        """Every child's ready object; raises RuntimeError naming a child that exited first,
        or when ``timeout`` seconds pass (or ``alive()`` turns False)."""
        import time

        infos: dict[str, Any] = {}
        deadline = time.monotonic() + timeout
        while len(infos) < len(self.procs):
            if time.monotonic() > deadline or not alive():
                raise RuntimeError(f"tensor-parallel ranks not ready: {sorted(set(self.procs) - set(infos))}")
            pending = [n for n in self.procs if n not in infos]
            ready = multiprocessing.connection.wait([self.conns[n] for n in pending]
                                                    + [self.procs[n].sentinel for n in pending], timeout=1.0)
            for n in pending:
                if self.conns[n] in ready or self.procs[n].sentinel in ready:
                    try:
                        infos[n] = self.conns[n].recv()
                    except (EOFError, OSError):
                        self.procs[n].join(10)
                        raise RuntimeError(f"{n} exited with code {self.procs[n].exitcode} during startup") from None
        return infos

    def dead(self) -> str | None:
        """"<name> exited with code N" for the first child that exited, else None."""
        for name, p in self.procs.items():
            if p.exitcode is not None:
                return f"{name} exited with code {p.exitcode}"
        return None

    def stop(self) -> None:
        """SIGTERM every child, SIGKILL after 3 s; idempotent."""
        for p in self.procs.values():
            if p.exitcode is None:
                p.terminate()
        for p in self.procs.values():
            p.join(3)
            if p.exitcode is None:
                p.kill()
                p.join(1)
