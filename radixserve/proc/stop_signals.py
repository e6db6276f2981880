"""SIGINT and SIGTERM in a launcher process (the HTTP server's, or a node's tensor-parallel ranks').

Contract: after ``install`` (main thread) the first SIGINT or SIGTERM raises
KeyboardInterrupt in the main thread: the launcher leaves what it is doing and runs its
orderly shutdown.  Once the shutdown started (that signal, or ``begin`` for another reason,
e.g. a dead child), every further SIGINT/SIGTERM is logged and ignored: the shutdown runs to
its end, every step of it bounded, so a second Ctrl-C or a supervisor's repeated SIGTERM
can neither cut the save of the prefix cache short nor leave children and ipc files behind.
SIGKILL ends the launcher at once (its children follow it).  uvicorn takes both signals over
while it serves and re-raises the first when it stops, which lands here.
"""
from __future__ import annotations

import logging
import signal
from types import FrameType
from typing import Optional

logger = logging.getLogger("radixserve.proc")


class StopSignals:
    def __init__(self) -> None:
        self.stopping = False

    def install(self) -> "StopSignals":
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handle)
        return self

    def begin(self) -> None:
        """The shutdown started: ignore further signals (any thread)."""
        self.stopping = True

    def _handle(self, signum: int, frame: Optional[FrameType]) -> None:
        name = signal.Signals(signum).name
        if self.stopping:
            logger.warning("%s: already shutting down (SIGKILL ends the server without the orderly stop)", name)
            return
        self.stopping = True
        logger.info("%s: shutting down", name)
        raise KeyboardInterrupt
