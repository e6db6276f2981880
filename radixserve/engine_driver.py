"""``EngineDriver``: one background thread that owns a ``Scheduler``.

Other threads ``submit`` groups of requests (built by ``request_builder`` + ``new_req``) and
get a ``Future`` of their native result dicts.  The driver thread drains its inbox, adds the
requests, steps the scheduler while it has work, and turns progress into output exactly as
the server does: ``take_output`` (token deltas) -> ``DetokState`` (the detokenizer process's
incremental, stop-string-safe text) -> ``OutputState`` (the shared native-response builder).
A streaming group's ``on_update(state)`` runs on the driver thread each time a request's
visible text grows and once when it finishes (keep it quick; never block on the engine).
If the scheduler raises, every pending and later future fails with that error; ``close``
fails what is pending with ``RuntimeError``.  Nothing but the driver thread touches the
scheduler while the driver runs; ``call(fn)`` runs ``fn(scheduler)`` there, between steps.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from radixserve.detokenizer.process import DetokState
from radixserve.output_state import OutputState
from radixserve.scheduler.outputs import take_output
from radixserve.scheduler.req import Req
from radixserve.scheduler.scheduler import Scheduler

logger = logging.getLogger(__name__)

OnUpdate = Callable[[OutputState], None]


def _settle(fut: Future, result: Any = None, error: Optional[BaseException] = None) -> None:
    """Set a future's outcome unless the caller cancelled it (e.g. a cancelled asyncio task)."""
    try:
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)
    except InvalidStateError:
        pass


@dataclass
class _Track:
    req: Req
    detok: DetokState
    state: OutputState
    group: "_Group"


@dataclass
class _Group:
    reqs: list[Req]
    future: Future
    on_update: Optional[OnUpdate]
    tracks: list[_Track] = field(default_factory=list)
    remaining: int = 0


class EngineDriver:
    def __init__(self, scheduler: Scheduler, tokenizer: Any, name: str = "radixserve-engine") -> None:
        self.scheduler = scheduler
        self.tokenizer = tokenizer
        self._inbox: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self._tracks: dict[str, _Track] = {}
        self._finished: list[Req] = []
        self._dead: Optional[BaseException] = None
        self._closed = False
        self._lock = threading.Lock()  # no command enters the inbox once the driver stopped
        scheduler.hooks.append(self._finished.append)
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ any thread
    def submit(self, reqs: list[Req], on_update: Optional[OnUpdate] = None) -> Future:
        """Future of ``[native result dict of r for r in reqs]`` (``{text, output_ids, meta_info}``).
        Rejection by the scheduler (e.g. OverflowError: queue full) fails the future and
        aborts the group's requests already added."""
        fut: Future = Future()
        self._put(_Group(list(reqs), fut, on_update), fut)
        return fut

    def abort(self, rid: str, message: str = "aborted by client") -> None:
        self._put(("abort", rid, message), None)

    def call(self, fn: Callable[[Scheduler], Any]) -> Future:
        """Future of ``fn(scheduler)``, run on the driver thread between steps (inline when
        called from the driver thread itself, e.g. from an ``on_update`` callback)."""
        fut: Future = Future()
        if threading.current_thread() is self._thread:
            self._run_call(fn, fut)
        else:
            self._put(("call", fn, fut), fut)
        return fut

    def close(self, wait: bool = True) -> None:
        """Stop the thread; pending futures fail.  Idempotent; ``wait`` joins the thread."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._inbox.put(None)
        if wait and threading.current_thread() is not self._thread:
            self._thread.join(timeout=30)

    def _put(self, item: Any, fut: Optional[Future]) -> None:
        with self._lock:
            if self._dead is None and not self._closed:
                self._inbox.put(item)
                return
        if fut is not None:
            _settle(fut, error=RuntimeError(f"engine driver stopped: {self._dead or 'shut down'}"))

    # ------------------------------------------------------------------ driver thread
    def _run_call(self, fn: Callable[[Scheduler], Any], fut: Future) -> None:
        try:
            result = fn(self.scheduler)
        except BaseException as e:
            _settle(fut, error=e)
        else:
            _settle(fut, result)

    def _accept(self, item: Any) -> None:
        if isinstance(item, tuple):
            if item[0] == "call":
                self._run_call(item[1], item[2])
            else:
                self.scheduler.abort(item[1], item[2])
            return
        group: _Group = item
        added: list[Req] = []
        try:
            for r in group.reqs:
                self.scheduler.add_request(r)
                added.append(r)
        except Exception as e:
            for r in added:
                self.scheduler.abort(r.rid, "a request of the same group was refused")
            _settle(group.future, error=e)
            return
        for i, r in enumerate(group.reqs):
            state = OutputState(r.rid, i, r.input_ids, r.return_logprob, r.logprob_start_len, r.top_logprobs_num)
            track = _Track(r, DetokState(self.tokenizer, r.sampling.skip_special_tokens,
                                         tuple(r.sampling.stop_strs)), state, group)
            group.tracks.append(track)
            self._tracks[r.rid] = track
        group.remaining = len(group.reqs)
        if not group.reqs:
            _settle(group.future, [])

    def _drain(self, block: bool) -> bool:
        """Take every queued command (waiting for one when ``block``); False on close."""
        try:
            item = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
            while True:
                if item is None:
                    return False
                self._accept(item)
                item = self._inbox.get_nowait()
        except queue.Empty:
            return True

    def _deliver(self, touched: list[Req]) -> None:
        reqs = {r.rid: r for r in touched}
        reqs.update((r.rid, r) for r in self._finished)
        self._finished.clear()
        now = time.perf_counter()
        for rid in reqs:
            track = self._tracks.get(rid)
            if track is None or (track.group.on_update is None and not track.req.finished):
                continue  # not ours, or nobody watches it before the end
            out = take_output(track.req, None)
            if out is None:
                continue
            track.detok.update(out)
            track.state.apply(out, now)
            group = track.group
            if group.on_update is not None and (out.text or out.finished):
                try:
                    group.on_update(track.state)
                except Exception:
                    logger.exception("stream callback failed")
            if out.finished:
                del self._tracks[rid]
                group.remaining -= 1
                if group.remaining == 0:
                    _settle(group.future, [t.state.to_native() for t in group.tracks])

    def _fail_all(self, error: BaseException) -> None:
        with self._lock:
            self._dead = error
        for track in self._tracks.values():
            _settle(track.group.future, error=error)
        self._tracks = {}
        while True:  # fail what was queued meanwhile
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, _Group):
                _settle(item.future, error=error)
            elif isinstance(item, tuple) and item[0] == "call":
                _settle(item[2], error=error)

    def _loop(self) -> None:
        sched = self.scheduler
        try:
            while self._drain(block=not (sched.has_work() or self._finished)):
                self._deliver(sched.step() if sched.has_work() else [])
        except BaseException as e:  # the scheduler broke: nothing can run any more
            logger.exception("engine driver stopped")
            self._fail_all(e)
            return
        self._fail_all(RuntimeError("engine driver shut down"))
