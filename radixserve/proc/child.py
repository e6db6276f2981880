"""The child side of a supervised process: logging, signals and the parent-death watchdog.

Contract: after ``setup_child`` a child process
- exits (code 1) within about half a second of its parent's death, however the parent died
  (``PR_SET_PDEATHSIG`` plus a watchdog thread), so nothing is ever orphaned;
- ignores SIGINT, SIGTERM and SIGHUP: a terminal's Ctrl-C, ``kill -TERM -- -PGID`` or
  systemd's ``KillMode=control-group`` reach the whole process group, but only the launcher
  acts on them; it alone decides the order of the shutdown (``supervisor.py``);
- ends at once on ``STOP_SIGNAL`` (SIGUSR1, the supervisor's stop request; default action),
  unless it registered ``on_stop`` to finish something first (the scheduler's final save of
  the prefix cache).  The supervisor SIGKILLs a child that is still there after its grace.

``run_child`` (the supervisor's spawn target) runs a child with Python's cyclic garbage
collector off until it sends its ready object: start-up (torch's import, the model's load)
allocates much and frees little, and the collector's passes over the growing heap cost about
a tenth of it.
"""
from __future__ import annotations

import ctypes
import gc
import logging
import os
import signal
import threading
import time
from typing import Any, Callable

STOP_SIGNAL = signal.SIGUSR1
IGNORED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # the supervisor blocks them across the spawn


def configure_logging(level: str, name: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO),
                        format=f"[%(asctime)s {name}] %(levelname)s %(name)s: %(message)s", force=True)


def _set_pdeathsig() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (best effort)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def set_process_name(name: str) -> None:
    """Name this process in ``top``/``ps -o comm``/``/proc/PID/comm`` (Linux, 15 bytes; best effort)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(15, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def start_parent_watchdog(parent_pid: int, interval: float = 0.5) -> None:
    """A daemon thread that hard-exits this process once ``parent_pid`` is gone."""

    def watch() -> None:
        while True:
            if os.getppid() != parent_pid:
                os._exit(1)
            time.sleep(interval)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def setup_child(name: str, log_level: str, parent_pid: int) -> None:
    """Call first thing in a child's entry point (see the module contract)."""
    _set_pdeathsig()
    if os.getppid() != parent_pid:  # the parent died before we got here
        os._exit(1)
    set_process_name(f"rs-{name}")
    for sig in IGNORED_SIGNALS:  # ignoring discards one already pending
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, IGNORED_SIGNALS)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    configure_logging(log_level, name)
    start_parent_watchdog(parent_pid)


def on_stop(callback: Callable[[], None]) -> None:
    """Run ``callback`` on the supervisor's stop request instead of ending at once.  Python runs
    it in the main thread between bytecodes, so only a child whose main thread never blocks
    for long (the scheduler's loop polls with a timeout) should use it; it must not raise."""
    signal.signal(STOP_SIGNAL, lambda *_: callback())


class _ReadyConn:
    """The child's end of its ready pipe: sending the ready object turns the collector back on."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def send(self, obj: Any) -> None:
        self._conn.send(obj)
        gc.enable()

    def close(self) -> None:
        self._conn.close()


def run_child(target: Callable[..., None], *args: Any) -> None:
    """``target(*args)`` (its last two: the ready pipe and the parent's pid), the collector off
    until ``target`` reports ready."""
    gc.disable()
    *rest, ready_conn, parent_pid = args
    target(*rest, _ReadyConn(ready_conn), parent_pid)
