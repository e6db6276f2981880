"""Child entry points for the ``radixserve.proc.Supervisor`` tests (module level: the "spawn"
context imports them by name).  Each takes its arguments, then ``ready_conn, parent_pid``."""
from __future__ import annotations

import os
import signal
import time

from radixserve.proc import STOP_SIGNAL, on_stop, setup_child


def idle(tag: str, ready_conn, parent_pid: int) -> None:
    """Ready with ``tag``, then idle until stopped (the stop request's default action)."""
    setup_child(tag, "warning", parent_pid)
    ready_conn.send(tag)
    while True:
        time.sleep(1)


def exit_at_once(code: int, ready_conn, parent_pid: int) -> None:
    setup_child("early", "warning", parent_pid)
    os._exit(code)


def finish_on_stop(seconds: float, marker: str, ready_conn, parent_pid: int) -> None:
    """On the stop request: ``seconds`` of work (a save), then ``marker`` written, then exit 0."""
    setup_child("saver", "warning", parent_pid)
    stopping: list[bool] = []
    on_stop(lambda: stopping.append(True))
    ready_conn.send("saver")
    while not stopping:
        time.sleep(0.05)
    time.sleep(seconds)
    with open(marker, "w") as f:
        f.write("saved")


def deaf(ready_conn, parent_pid: int) -> None:
    """Ignores even the stop request: only SIGKILL ends it."""
    setup_child("deaf", "warning", parent_pid)
    signal.signal(STOP_SIGNAL, signal.SIG_IGN)
    ready_conn.send("deaf")
    while True:
        time.sleep(1)
