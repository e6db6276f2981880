"""A pool of compile processes with a per-job timeout that kills runaway compilations.

Contract:
- ``submit(regex)`` returns a ``concurrent.futures.Future`` at once; the calling (scheduler)
  thread never blocks on a compilation.  The future resolves to an ``outlines_core.Index``,
  or fails with ``CompileTimeout`` (the job ran longer than ``timeout`` seconds of compile
  time; its process is killed and restarted for the next job) or ``CompileError`` (the
  compiler rejected the pattern, ran out of memory, or its process died).
- Each of ``workers`` slots is one daemon thread feeding one child process
  (``compile_worker.py``, started lazily and reused); time spent queued or starting a
  child does not count against the timeout.  Child processes exit with their parent.
"""
from __future__ import annotations

import atexit
import itertools
import logging
import os
import pickle
import queue
import select
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from typing import Any, Optional

from radixserve.constrained.runtime.compile_worker import read_frame, write_frame

logger = logging.getLogger(__name__)

WORKER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "compile_worker.py")
START_TIMEOUT = 60.0


class CompileError(ValueError):
    pass


class CompileTimeout(CompileError):
    pass


def _read(stream, deadline: Optional[float]) -> Any:
    """One frame, or TimeoutError when nothing arrives before ``deadline``; EOFError if the
    child died."""
    if deadline is not None:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([stream], [], [], left)[0]:
            raise TimeoutError
    msg = read_frame(stream)
    if msg is None:
        raise EOFError
    return msg


class _Slot:
    """One child process and the thread that talks to it."""

    def __init__(self, pool: "CompilePool", n: int) -> None:
        self.pool = pool
        self.proc: Optional[subprocess.Popen] = None
        self.thread = threading.Thread(target=self.run, name=f"grammar-compile-{n}", daemon=True)
        self.thread.start()

    def start(self) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen([sys.executable, WORKER_SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env=env, close_fds=True)
        write_frame(self.proc.stdin, (self.pool.vocabulary, self.pool.memory_mb))
        msg = _read(self.proc.stdout, time.monotonic() + START_TIMEOUT)
        if msg != ("ready",):
            raise EOFError

    def kill(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            try:
                proc.kill()
                proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
            for s in (proc.stdin, proc.stdout):
                try:
                    s.close()
                except (OSError, ValueError):
                    pass

    def run(self) -> None:
        while True:
            job = self.pool.jobs.get()
            if job is None:
                self.kill()
                return
            job_id, regex, fut = job
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                if self.proc is None or self.proc.poll() is not None:
                    self.kill()
                    self.start()
                t0 = time.monotonic()
                write_frame(self.proc.stdin, (job_id, regex))
                reply = _read(self.proc.stdout, t0 + self.pool.timeout)
                _, status, payload = reply
                self.pool.compile_seconds.append(time.monotonic() - t0)
                if status == "ok":
                    fut.set_result(payload)
                else:
                    fut.set_exception(CompileError(payload))
            except TimeoutError:
                self.kill()
                fut.set_exception(CompileTimeout(f"compilation timed out after {self.pool.timeout:g} s"))
            except (EOFError, OSError, pickle.UnpicklingError) as e:
                code = self.proc.poll() if self.proc is not None else None
                self.kill()
                fut.set_exception(CompileError(f"the compile process died (exit code {code}; memory limit "
                                               f"{self.pool.memory_mb} MB?): {type(e).__name__}"))
            except Exception as e:  # noqa: BLE001 - a future must always resolve
                self.kill()
                fut.set_exception(CompileError(f"{type(e).__name__}: {e}"))


class CompilePool:
    def __init__(self, vocabulary: Any, workers: int = 1, timeout: float = 30.0, memory_mb: int = 4096) -> None:
        self.vocabulary = vocabulary
        self.timeout = float(timeout)
        self.memory_mb = int(memory_mb)
        self.jobs: "queue.Queue[Optional[tuple]]" = queue.Queue()
        self.compile_seconds: list[float] = []  # wall time of every finished compilation
        self._ids = itertools.count()
        self.slots = [_Slot(self, i) for i in range(max(1, int(workers)))]
        atexit.register(self.close)

    def submit(self, regex: str) -> Future:
        fut: Future = Future()
        self.jobs.put((next(self._ids), regex, fut))
        return fut

    def close(self) -> None:
        for _ in self.slots:
            self.jobs.put(None)
        for s in self.slots:
            s.kill()
