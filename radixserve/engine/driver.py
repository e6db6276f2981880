"""``EngineDriver``: one thread of its own builds the model and steps a ``Scheduler``, for every
thread that submits.

Other threads ``submit`` groups of requests (built by ``request_builder`` + ``new_req``) and
get a ``Future`` of their native result dicts.  The driver's thread drains the inbox, adds the
requests, steps while there is work, and turns progress into output exactly as the server
does: ``take_output`` (token deltas) -> ``DetokState`` (the detokenizer process's incremental,
stop-string-safe text) -> ``OutputState`` (the shared native-response builder).

Why one thread does all the torch work (the model's construction, passed in as ``build``, and
every step): torch's CPU ops run in OpenMP parallel regions, and OpenMP gives each thread that
starts one a thread team of its own, and teams on the same cores wait for each other.  When the
calling thread stepped the model (the design before), a call from a new thread each time (as
``frontend_lang``'s programs make them) took 437 to 517 ms against 218 to 266 ms from the
thread that built the model (the 2-core EPYC Zen 4 here, SmolLM2 int4, 32 greedy tokens,
``benchmarks/bench_engine_threads.py``).  The programs of
``frontend_lang`` call the engine from many threads; with the work on one thread they run as
fast as a single-threaded script (``benchmarks/results/2026-12-07-engine-thread.md``).

A streaming group's ``on_update(state)`` runs on the driver's thread each time a request's
visible text grows and once when it finishes (keep it quick; never wait on the engine there:
``wait`` raises RuntimeError on that thread).  If ``build`` or a step raises (KeyboardInterrupt
in a step included), every pending and later future fails with that error; ``close`` fails
what is pending with ``RuntimeError``.  Only the driver's thread touches the scheduler;
``call(fn)`` runs ``fn(scheduler)`` there, between steps.
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

Build = Callable[[], "tuple[Scheduler, Any]"]  # -> (scheduler, tokenizer), on the driver's thread


class EngineDriver:
    def __init__(self, build: Build, name: str = "radixserve-engine") -> None:
        self.scheduler: Optional[Scheduler] = None
        self._inbox: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self._kick = threading.Event()  # set when a command arrives
        self._groups: Optional[GroupTracker] = None
        self._finished: list[Req] = []
        self._dead: Optional[BaseException] = None
        self._closed = False
        self._lock = threading.Lock()  # no command enters the inbox once the driver stopped
        self.ready: Future = Future()  # settles when ``build`` returned (or with its error)
        self._build: Optional[Build] = build  # dropped once run: it may hold the Engine under construction
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
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
        """Future of ``fn(scheduler)``, run between steps (inline when called from the driver's
        thread itself, e.g. from an ``on_update`` callback)."""
        fut: Future = Future()
        if threading.current_thread() is self._thread:
            self._run_call(fn, fut)
        else:
            self._put(("call", fn, fut), fut)
        return fut

    def check_caller(self) -> None:
        """Raise RuntimeError on the driver's thread: waiting there for the engine would deadlock."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("an engine callback cannot wait for the engine")

    def wait(self, fut: Future, timeout: Optional[float] = None) -> Any:
        """``fut``'s result, blocking the calling thread (never the driver's: ``check_caller``)."""
        self.check_caller()
        return fut.result(timeout)

    def close(self, wait: bool = True) -> None:
        """Stop the driver; pending futures fail.  Idempotent; ``wait`` joins the thread."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._inbox.put(None)
                self._kick.set()
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

    # ------------------------------------------------------------------ the driver's thread
    def _main(self) -> None:
        build, self._build = self._build, None
        try:
            scheduler, tokenizer = build()
        except BaseException as e:  # noqa: BLE001 - the constructing thread re-raises it
            with self._lock:
                self._dead = e
            settle(self.ready, error=e)
            self._fail_all(e)
            return
        del build
        self.scheduler = scheduler
        self._groups = GroupTracker(tokenizer)
        scheduler.hooks.append(self._finished.append)
        settle(self.ready)
        while self._alive():
            if not self._iterate() and self._alive():
                self._kick.wait(0.5)  # idle until a command arrives
        self._fail_all(RuntimeError("engine driver shut down") if self._dead is None else self._dead)

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
        if self._groups is not None:
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
