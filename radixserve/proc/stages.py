"""Start-up stages: one log line as each starts and ends, and a heartbeat while a long one runs.

A first start on a fresh machine runs stages of a second to minutes (download, conversion,
kernels, numerics timing, accuracy check, weights, KV pool, then ready), spread over the
server and the worker process.  Each is wrapped in ``stage(name)`` in the process that runs it,
so the terminal (every child logs to the server's stderr) reads as one story:

    [... worker] INFO radixserve.stage: numerics timing: started (8 paths at 6 row counts)
    [... worker] INFO radixserve.stage: numerics timing: [####........] 3/8 paths, 12 s (int8)
    [... worker] INFO radixserve.stage: numerics timing: done in 21.4 s (measured)

Contract:
- ``stage(name, detail)`` logs "<name>: started (<detail>)" on entry and "<name>: done in S s
  (<result>)" on exit, or "<name>: failed after S s: <error>" (the error propagates).  It yields
  a ``Progress`` that the stage's code may advance (``step``) and label (``result``).
- While the stage runs, a daemon thread logs "<name>: [bar] done/total <unit>, S s (<what>)"
  every ``HEARTBEAT_S`` seconds (only the innermost of nested stages beats), so a start is never
  silent for long, in a terminal and in a log file alike (no carriage returns, no TTY needed).
- ``note(name, text)`` is the one line of a stage with nothing to do ("conversion: cached").
- ``current()`` is the innermost running stage's ``Progress``, for code called deep inside one.
Standard library only: every process may use it (the scheduler and the server never import torch).
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Iterator, Optional

logger = logging.getLogger("radixserve.stage")

HEARTBEAT_S = 4.0  # seconds between progress lines of a running stage (the bound on silence is twice it)
BAR_WIDTH = 12

_active: list["Progress"] = []  # running stages of this process, innermost last
_lock = threading.Lock()


class Progress:
    """What a running stage has done: ``done`` of ``total`` ``unit`` (total 0: unknown) and what it
    is on now; read by the heartbeat thread, written by the stage's code."""

    def __init__(self, name: str, total: int = 0, unit: str = "") -> None:
        self.name, self.total, self.unit = name, total, unit
        self.done = 0
        self.current = ""
        self.outcome = ""
        self.started = time.monotonic()

    def step(self, current: str = "", n: int = 1) -> None:
        """Count ``n`` more units done; ``current``: what the stage works on next (or just did)."""
        self.done += n
        if current:
            self.current = current

    def working_on(self, current: str) -> None:
        self.current = current

    def add_total(self, n: int) -> None:
        """More units than announced (a retake)."""
        self.total += n

    def result(self, text: str) -> None:
        """What the end line reports in parentheses."""
        self.outcome = text

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def line(self) -> str:
        """The heartbeat's text (without the stage's name)."""
        parts = []
        if self.total:
            filled = min(BAR_WIDTH, round(BAR_WIDTH * self.done / self.total))
            parts.append(f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {self.done}/{self.total}"
                         + (f" {self.unit}" if self.unit else "") + ",")
        else:
            parts.append("still running,")
        parts.append(f"{self.elapsed():.0f} s")
        return " ".join(parts) + (f" ({self.current})" if self.current else "")


def _beat(p: Progress, stop: threading.Event, every: float) -> None:
    while not stop.wait(every):
        with _lock:
            innermost = bool(_active) and _active[-1] is p
        if innermost:
            logger.info("%s: %s", p.name, p.line())


@contextlib.contextmanager
def stage(name: str, detail: str = "", total: int = 0, unit: str = "",
          heartbeat: Optional[float] = None) -> Iterator[Progress]:
    """Log the start and end of stage ``name`` and beat every ``heartbeat`` (default
    ``HEARTBEAT_S``) seconds while it runs (see the module contract)."""
    p = Progress(name, total, unit)
    logger.info("%s: started%s", name, f" ({detail})" if detail else "")
    stop = threading.Event()
    with _lock:
        _active.append(p)
    beat = threading.Thread(target=_beat, args=(p, stop, heartbeat or HEARTBEAT_S), name=f"stage {name}", daemon=True)
    beat.start()
    try:
        yield p
    except BaseException as e:
        logger.info("%s: failed after %.1f s: %s", name, p.elapsed(), f"{type(e).__name__}: {e}"[:300])
        raise
    else:
        logger.info("%s: done in %.1f s%s", name, p.elapsed(), f" ({p.outcome})" if p.outcome else "")
    finally:
        stop.set()
        with _lock:
            _active.remove(p)


def current() -> Progress:
    """The innermost running stage's ``Progress`` (a detached one when none runs), for code deep
    inside a stage to report what it is on."""
    with _lock:
        return _active[-1] if _active else Progress("")


def note(name: str, text: str) -> None:
    """The single line of a stage that had nothing (long) to do: "<name>: <text>"."""
    logger.info("%s: %s", name, text)
