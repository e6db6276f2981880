"""The soak's server supervisor, fault injector and memory probe.

``Supervisor`` plays systemd's ``Restart=on-failure`` (or Kubernetes' restart policy with a
liveness probe on ``/health`` and readiness on ``/health_generate``): it starts the server
command, and when the server process exits it records the exit code and, if asked, starts the
same command again and waits until ``/health_generate`` answers 200.  It also keeps the
outage windows (from the moment a fault takes the server down until it is healthy again) that
decide whether a connection error was "server down" or a lost request.
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

import httpx

from tests.helpers.server_harness import ServerHandle  # the tests' launcher: one way to start a server


def tree_pids(root: int) -> list[int]:
    """``root`` and every descendant, from /proc (Linux)."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def tree_rss_mb(root: int) -> float:
    """Resident memory (VmRSS) summed over ``root``'s process tree, in MiB."""
    total_kb = 0
    for pid in tree_pids(root):
        try:
            with open(f"/proc/{pid}/status") as f:
                total_kb += next((int(line.split()[1]) for line in f if line.startswith("VmRSS:")), 0)
        except OSError:
            continue
    return total_kb / 1024


class Supervisor:
    """Runs one server at a time from ``model`` and flags; ``restart`` swaps the flags."""

    def __init__(self, model: str, flags: list[str], ready_timeout: float = 600.0) -> None:
        self.model, self.flags, self.ready_timeout = model, list(flags), ready_timeout
        self.handle: Optional[ServerHandle] = None
        self.outages: list[list[float]] = []  # [start, end]; end is inf while still down
        self.exit_codes: list[int] = []
        self.restarts = 0
        self.kv_capacity = 0  # of the running server, for oversize requests
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="supervisor")  # lives until stop()

    @property
    def url(self) -> str:
        assert self.handle is not None
        return self.handle.url

    def start(self) -> None:
        """Start the server and wait for /health_generate.  Runs on the supervisor's own
        thread: the harness asks Linux to SIGTERM the server when the thread that started it
        exits (PR_SET_PDEATHSIG), so a short-lived thread must never start one."""
        self._pool.submit(self._start).result()

    def _start(self) -> None:
        self.handle = ServerHandle(self.model, *self.flags)
        self.handle.wait_ready(self.ready_timeout)
        deadline = time.monotonic() + 120
        while True:  # /health says the HTTP side is up; /health_generate that a token comes out
            try:
                if httpx.get(self.handle.url + "/health_generate", timeout=60).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"/health_generate never answered 200:\n{self.handle.log_tail()}")
            time.sleep(0.5)
        self.kv_capacity = self.handle.info()["worker"]["num_slots"] - 1
        self.end_outage()

    def end_outage(self) -> None:
        with self._lock:
            for w in self.outages:
                w[1] = min(w[1], time.monotonic())

    def is_down(self) -> bool:
        with self._lock:
            return bool(self.outages) and self.outages[-1][1] == float("inf")

    def begin_outage(self) -> None:
        with self._lock:
            self.outages.append([time.monotonic(), float("inf")])

    def was_down(self, t0: float, t1: float) -> bool:
        """Whether an outage window overlaps [t0, t1]."""
        with self._lock:
            return any(a <= t1 and t0 <= b for a, b in self.outages)

    def wait_exit(self, timeout: float) -> Optional[int]:
        """The server's exit code once it exits by itself (None if it is still up after ``timeout``)."""
        assert self.handle is not None
        try:
            rc = self.handle.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        self.exit_codes.append(rc)
        return rc

    def restart(self, flags: Optional[list[str]] = None) -> None:
        """Stop the server if it runs (SIGTERM), then start it again (with ``flags`` if given)."""
        assert self.handle is not None
        running = self.handle.proc.poll() is None
        if running:
            self.begin_outage()
        self.handle.stop()
        if running:
            self.exit_codes.append(self.handle.proc.returncode)
        if flags is not None:
            self.flags = list(flags)
        self.restarts += 1
        self.start()

    def pids(self) -> dict[str, int]:
        assert self.handle is not None
        return self.handle.info()["pids"]

    def rss_mb(self) -> float:
        assert self.handle is not None
        return tree_rss_mb(self.handle.proc.pid)

    def stop(self) -> None:
        if self.handle is not None:
            self.handle.stop()
        self._pool.shutdown()


def stall_detokenizer(sup: Supervisor, times: int, seconds: float, gap: float, stop: threading.Event,
                      log: list[str]) -> None:
    """SIGSTOP the detokenizer for ``seconds``, ``times`` times, ``gap`` s apart (a thread body);
    always SIGCONTs what it stopped."""
    pid = sup.pids()["detokenizer"]
    for i in range(times):
        if stop.wait(gap):
            return
        try:
            os.kill(pid, signal.SIGSTOP)
            log.append(f"SIGSTOP detokenizer {pid} ({i + 1}/{times})")
            stop.wait(seconds)
        finally:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass


def kill_worker(sup: Supervisor, log: list[str], exit_timeout: float = 15.0) -> Optional[int]:
    """SIGKILL the process that holds the model (with one rank the scheduler, ``worker/local.py``);
    return the server's exit code (None: it did not exit in time)."""
    pids = sup.pids()
    name = "worker" if "worker" in pids else "scheduler"
    pid = pids[name]
    sup.begin_outage()
    os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    rc = sup.wait_exit(exit_timeout)
    log.append(f"SIGKILL model {name} {pid}: server exited with {rc} after {time.monotonic() - t0:.1f} s")
    return rc
