"""``EngineDriver``: steps a ``Scheduler`` for many threads, one thread at a time.

Other threads ``submit`` groups of requests (built by ``request_builder`` + ``new_req``) and
get a ``Future`` of their native result dicts.  Whoever steps the scheduler drains the inbox,
adds the requests, steps while there is work, and turns progress into output exactly as the
server does: ``take_output`` (token deltas) -> ``DetokState`` (the detokenizer process's
incremental, stop-string-safe text) -> ``OutputState`` (the shared native-response builder).

Who steps: a thread blocked on a result (``drive(done)``, used by ``Engine.generate`` and
``generate_stream``) steps the scheduler itself, for every pending request, until its own
result is there; other such threads wait for the step lock meanwhile.  With no such thread,
a background thread steps (futures for asyncio callers, aborts, ``call``).  Stepping in the
caller's thread matters on CPUs: measured on the 2-core Xeon here, the same generate ran
~27% slower when a second thread stepped the scheduler than when the main thread did
(torch's OpenMP parallel regions; ``docs/ARCHITECTURE.md``).

A streaming group's ``on_update(state)`` runs on the stepping thread each time a request's
visible text grows and once when it finishes (keep it quick; never wait on the engine there).
If the scheduler raises (KeyboardInterrupt in a step included), every pending and later
future fails with that error; ``close`` fails what is pending with ``RuntimeError``.  Only the
holder of the step lock touches the scheduler; ``call(fn)`` runs ``fn(scheduler)`` there,
between steps.
"""
from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import Future
from typing import Any, Callable, Optional

from radixserve.engine.groups import GroupTracker, OnUpdate, Group, settle
from radixserve.scheduler.req import Req
from radixserve.scheduler.scheduler import Scheduler

logger = logging.getLogger(__name__)

class EngineDriver:
    def __init__(self, scheduler: Scheduler, tokenizer: Any, name: str = "radixserve-engine") -> None:
        self.scheduler = scheduler
        self.tokenizer = tokenizer
        self._inbox: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self._kick = threading.Event()  # set when a command arrives
        self._groups = GroupTracker(tokenizer)
        self._finished: list[Req] = []
        self._dead: Optional[BaseException] = None
        self._closed = False
        self._lock = threading.Lock()  # no command enters the inbox once the driver stopped
        self._step_lock = threading.Lock()  # held by the thread that steps the scheduler
        self._stepper: Optional[threading.Thread] = None
        self._callers = 0  # threads in drive(): the background thread leaves the stepping to them
        self._callers_cv = threading.Condition()
        scheduler.hooks.append(self._finished.append)
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ any thread
    def submit(self, reqs: list[Req], on_update: Optional[OnUpdate] = None) -> Future:
        """Future of ``[native result dict of r for r in reqs]`` (``{text, output_ids, meta_info}``).
        Rejection by the scheduler (e.g. OverflowError: queue full) fails the future and
        aborts the group's requests already added."""
        fut: Future = Future()
        self._put(Group(list(reqs), fut, on_update), fut)
        return fut

    def abort(self, rid: str, message: str = "aborted by client") -> None:
        self._put(("abort", rid, message), None)

    def call(self, fn: Callable[[Scheduler], Any]) -> Future:
        """Future of ``fn(scheduler)``, run between steps (inline when called from the stepping
        thread itself, e.g. from an ``on_update`` callback)."""
        fut: Future = Future()
        if threading.current_thread() is self._stepper:
            self._run_call(fn, fut)
        else:
            self._put(("call", fn, fut), fut)
        return fut

    def drive(self, done: Callable[[], bool]) -> None:
        """Step the scheduler on the calling thread (for every pending request) until ``done()``
        or the driver stops.  Raises RuntimeError when called from an ``on_update`` callback."""
        if threading.current_thread() is self._stepper:
            raise RuntimeError("an engine callback cannot wait for the engine")
        with self._callers_cv:
            self._callers += 1
        try:
            while not done() and self._alive():
                with self._step_lock:
                    self._stepper = threading.current_thread()
                    try:
                        while not done() and self._alive():
                            if not self._iterate():
                                self._kick.wait(0.05)  # idle until a command arrives
                    finally:
                        self._stepper = None
        finally:
            with self._callers_cv:
                self._callers -= 1
                self._callers_cv.notify_all()

    def close(self, wait: bool = True) -> None:
        """Stop the driver; pending futures fail.  Idempotent; ``wait`` joins the thread."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._inbox.put(None)
                self._kick.set()
        with self._callers_cv:
            self._callers_cv.notify_all()
        if wait and threading.current_thread() is not self._thread:
            self._thread.join(timeout=30)

    def _alive(self) -> bool:
        return self._dead is None and not self._closed

    def _put(self, item: Any, fut: Optional[Future]) -> None:
        with self._lock:
            if self._dead is None and not self._closed:
                self._inbox.put(item)
                self._kick.set()
                return
        if fut is not None:
            settle(fut, error=RuntimeError(f"engine driver stopped: {self._dead or 'shut down'}"))

    # ------------------------------------------------------------------ the stepping thread (step lock held)
    def _run_call(self, fn: Callable[[Scheduler], Any], fut: Future) -> None:
        try:
            result = fn(self.scheduler)
        except BaseException as e:
            settle(fut, error=e)
        else:
            settle(fut, result)

    def _accept(self, item: Any) -> None:
        if isinstance(item, tuple):
            if item[0] == "call":
                self._run_call(item[1], item[2])
            else:
                self.scheduler.abort(item[1], item[2])
            return
        self._groups.add(item, self.scheduler)

    def _drain(self) -> bool:
        """Take every queued command; False once the driver is closed."""
        try:
            while True:
                item = self._inbox.get_nowait()
                if item is None:
                    return False
                self._accept(item)
        except queue.Empty:
            return True

    def _iterate(self) -> bool:
        """Commands, then one scheduler step if there is work; False when there was nothing to do.
        A failing step (the scheduler is then in an unknown state) stops the driver for good."""
        self._kick.clear()
        try:
            if not self._drain():
                return False
            if not (self.scheduler.has_work() or self._finished):
                return False
            touched = self.scheduler.step() if self.scheduler.has_work() else []
            self._groups.deliver(touched + self._finished)
            self._finished.clear()
        except BaseException as e:  # noqa: BLE001 - KeyboardInterrupt mid-step too
            logger.exception("engine driver stopped")
            self._fail_all(e)
            return False
        return True

    def _fail_all(self, error: BaseException) -> None:
        with self._lock:
            self._dead = error
        self._groups.fail_all(error)
        while True:  # fail what was queued meanwhile
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, Group):
                settle(item.future, error=error)
            elif isinstance(item, tuple) and item[0] == "call":
                settle(item[2], error=error)

    def _loop(self) -> None:
        """The background stepper: steps only while no thread is in ``drive``."""
        while self._alive():
            with self._callers_cv:
                while self._callers and self._alive():
                    self._callers_cv.wait(0.5)
            busy = False
            with self._step_lock:
                if not self._callers:
                    self._stepper = threading.current_thread()
                    try:
                        busy = self._iterate()
                    finally:
                        self._stepper = None
            if not busy and self._alive():
                self._kick.wait(0.5)
        with self._step_lock:
            self._fail_all(RuntimeError("engine driver shut down") if self._dead is None else self._dead)
