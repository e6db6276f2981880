"""Child-process setup: logging, signals and the parent-death watchdog.

Contract: after ``setup_child`` a child process exits (code 1) within about half a second
of its parent's death, however the parent died, so nothing is ever orphaned.  Ctrl-C in
the terminal reaches the whole process group; children ignore SIGINT and leave the
orderly shutdown to the launcher, which sends SIGTERM (default action: exit at once).
"""
from __future__ import annotations

import ctypes
import logging
import os
import signal
import threading
import time


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
    _set_pdeathsig()
    if os.getppid() != parent_pid:  # the parent died before we got here
        os._exit(1)
    set_process_name(f"rs-{name}")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # SIGTERM keeps its default action: a Python-level handler would only run once the main
    # thread leaves a blocking zmq call, which a signal delivered to another thread never ends.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    configure_logging(log_level, name)
    start_parent_watchdog(parent_pid)
