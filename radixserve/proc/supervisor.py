"""``Supervisor``: the parent side of a set of named child processes (no torch import here).

Contract:
- ``start(name, target, *args)`` spawns ``target(*args, ready_conn, parent_pid)`` (the
  "spawn" context, through ``run_child``; the child calls ``setup_child`` and sends one object
  on ``ready_conn`` once it is ready).  SIGINT/SIGTERM/SIGHUP are blocked across the spawn,
  so a signal to the process group never reaches a child before it ignores them.
- ``wait_ready`` returns every child's ready object, or raises ``ChildDied`` as soon as one
  exits first (RuntimeError after ``timeout``).
- ``dead`` names the first child that exited and how (``ChildExit``); the owner polls it.
- ``stop(order)`` stops the children one by one, ``order`` first: ``STOP_SIGNAL``, then up to
  the child's ``grace`` seconds for it to exit (cut short when a child it ``needs`` is gone:
  the scheduler cannot save the prefix cache without the worker), then SIGKILL.  Every wait
  is bounded; ``stop`` is idempotent and thread-safe, and also runs at interpreter exit
  (multiprocessing's own exit handler would otherwise wait forever on children that ignore
  its SIGTERM).
"""
from __future__ import annotations

import atexit
import contextlib
import dataclasses
import logging
import multiprocessing as mp
import multiprocessing.connection
import os
import signal
import threading
import time
from typing import Any, Callable, Iterator, Optional, Sequence

from radixserve.proc.child import IGNORED_SIGNALS, STOP_SIGNAL, run_child

logger = logging.getLogger("radixserve.proc")

STOP_GRACE_S = 3.0  # a child's default time to exit after the stop request
KILL_WAIT_S = 5.0  # after SIGKILL (a process in uninterruptible sleep may take a moment)


@dataclasses.dataclass(frozen=True)
class ChildExit:
    name: str
    exitcode: int

    def __str__(self) -> str:
        code = self.exitcode
        how = f" ({signal.Signals(-code).name})" if code < 0 and -code in signal.valid_signals() else ""
        return f"{self.name} process exited with code {code}{how}"


class ChildDied(RuntimeError):
    """A child exited before it was ready."""

    def __init__(self, exit: ChildExit) -> None:
        super().__init__(f"{exit} during startup")
        self.exit = exit


@dataclasses.dataclass
class _Child:
    process: Any
    conn: Any
    grace: float
    needs: tuple[str, ...]


@contextlib.contextmanager
def _group_signals_blocked() -> Iterator[None]:
    """The spawned child inherits the blocked mask; ``setup_child`` ignores, then unblocks."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, IGNORED_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class Supervisor:
    def __init__(self) -> None:
        self._ctx = mp.get_context("spawn")
        self.children: dict[str, _Child] = {}
        self._lock = threading.Lock()

    @property
    def pids(self) -> dict[str, int]:
        return {name: c.process.pid for name, c in self.children.items()}

    def start(self, name: str, target: Callable[..., None], *args: Any, grace: float = STOP_GRACE_S,
              needs: Sequence[str] = ()) -> None:
        """Spawn ``target(*args, ready_conn, parent_pid)`` as child ``name`` (see the module doc)."""
        recv, send = self._ctx.Pipe(duplex=False)
        p = self._ctx.Process(target=run_child, name=f"radixserve-{name}", daemon=True,
                              args=(target, *args, send, os.getpid()))
        with _group_signals_blocked():
            p.start()
        send.close()
        if not self.children:
            atexit.register(self.stop)
        self.children[name] = _Child(p, recv, grace, tuple(needs))

    def wait_ready(self, timeout: Optional[float] = None,
                   alive: Callable[[], bool] = lambda: True) -> dict[str, Any]:
        """Every child's ready object.  Raises ``ChildDied`` naming a child that exited first, or
        RuntimeError when ``timeout`` seconds pass or ``alive()`` turns False."""
        infos: dict[str, Any] = {}
        deadline = None if timeout is None else time.monotonic() + timeout
        while len(infos) < len(self.children):
            pending = {n: c for n, c in self.children.items() if n not in infos}
            if (deadline is not None and time.monotonic() > deadline) or not alive():
                raise RuntimeError(f"child processes not ready: {sorted(pending)}")
            ready = multiprocessing.connection.wait([c.conn for c in pending.values()]
                                                    + [c.process.sentinel for c in pending.values()], timeout=1.0)
            for n, c in pending.items():
                if c.conn in ready or c.process.sentinel in ready:
                    try:
                        infos[n] = c.conn.recv()
                    except (EOFError, OSError):
                        c.process.join(KILL_WAIT_S)
                        raise ChildDied(ChildExit(n, c.process.exitcode)) from None
                    logger.info("%s process ready (pid %d)", n, c.process.pid)
        return infos

    def dead(self) -> Optional[ChildExit]:
        """The first child that exited, else None."""
        for name, c in self.children.items():
            if c.process.exitcode is not None:
                return ChildExit(name, c.process.exitcode)
        return None

    def stop(self, order: Sequence[str] = ()) -> None:
        """Stop every child, those of ``order`` first, in that order (see the module doc)."""
        with self._lock:
            names = [n for n in order if n in self.children] + [n for n in self.children if n not in order]
            for name in names:
                self._stop_one(name)
            for c in self.children.values():
                c.conn.close()
            atexit.unregister(self.stop)

    def _stop_one(self, name: str) -> None:
        c = self.children[name]
        p = c.process
        if p.exitcode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, STOP_SIGNAL)
        deadline = time.monotonic() + c.grace
        while p.exitcode is None and (left := deadline - time.monotonic()) > 0:
            gone = [n for n in c.needs if n in self.children and self.children[n].process.exitcode is not None]
            if gone:
                logger.warning("%s exited: killing %s without waiting for it to stop", ", ".join(gone), name)
                break
            needed = [self.children[n].process.sentinel for n in c.needs if n in self.children]
            multiprocessing.connection.wait([p.sentinel, *needed], timeout=left)
        else:
            if p.exitcode is None:
                logger.warning("%s process did not stop within %.0f s; killing it", name, c.grace)
        if p.exitcode is None:
            p.kill()
            p.join(KILL_WAIT_S)
