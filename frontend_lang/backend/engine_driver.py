"""``EngineDriver``: makes an in-process ``radixserve.Engine`` usable from many threads.

``Engine.generate`` drives the scheduler itself and is not thread-safe.  The driver owns
the scheduler on one background thread: other threads ``submit`` request groups (built
with ``Engine._make_reqs``) and get a ``Future`` of their result dicts; the driver adds
them, steps the scheduler while there is work, streams text to an optional callback and
settles each future when its group finishes.  If the scheduler raises, every pending and
later future fails with that error, so no caller waits forever.
"""
from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from radixserve.detokenizer.incremental import IncrementalDecoder
from radixserve.detokenizer.process import safe_text_len

logger = logging.getLogger(__name__)

OnText = Callable[[int, str], None]  # (index in the group, cumulative output text)


@dataclass
class _Group:
    reqs: list
    future: Future
    on_text: Optional[OnText]
    decoders: dict = field(default_factory=dict)
    sent: dict = field(default_factory=dict)


class EngineDriver:
    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self._inbox: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self._groups: list[_Group] = []
        self._owner: dict[str, _Group] = {}
        self._dead: Optional[BaseException] = None
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="frontend-engine-driver", daemon=True)
        self._thread.start()

    def submit(self, reqs: list, on_text: Optional[OnText] = None) -> Future:
        """Future of ``[engine.result(r) for r in reqs]``; ``on_text(i, text)`` runs on the driver
        thread with request i's cumulative text whenever it grows (keep it quick)."""
        fut: Future = Future()
        if self._dead is not None or self._closed:
            fut.set_exception(RuntimeError(f"engine driver stopped: {self._dead or 'closed'}"))
            return fut
        self._inbox.put(_Group(list(reqs), fut, on_text))
        return fut

    def abort(self, rid: str) -> None:
        self._inbox.put(("abort", rid))

    def call(self, fn: Callable[[Any], Any]) -> Future:
        """Future of ``fn(engine)``, run on the driver thread between steps (for checks that
        must not race the scheduler, such as ``check_invariants``)."""
        fut: Future = Future()
        self._inbox.put(("call", fn, fut))
        return fut

    def close(self) -> None:
        self._closed = True
        self._inbox.put(None)
        self._thread.join(timeout=30)

    # ------------------------------------------------------------------ driver thread
    def _accept(self, item: Any) -> None:
        sched = self.engine.scheduler
        if isinstance(item, tuple) and item[0] == "call":
            try:
                item[2].set_result(item[1](self.engine))
            except Exception as e:
                item[2].set_exception(e)
            return
        if isinstance(item, tuple):
            sched.abort(item[1], "aborted by client")
            return
        group: _Group = item
        added = []
        try:
            for r in group.reqs:
                sched.add_request(r)
                added.append(r)
        except Exception as e:
            for r in added:
                sched.abort(r.rid, "a request of the same group was refused")
            group.future.set_exception(e)
            return
        for r in group.reqs:
            self._owner[r.rid] = group
            if group.on_text is not None:
                group.decoders[r.rid] = IncrementalDecoder(self.engine.tokenizer, r.sampling.skip_special_tokens)
                group.sent[r.rid] = 0
        self._groups.append(group)

    def _drain(self, block: bool) -> bool:
        """Take every queued command (waiting briefly for one when ``block``); False on close."""
        try:
            item = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
            while True:
                if item is None:
                    return False
                self._accept(item)
                item = self._inbox.get_nowait()
        except queue.Empty:
            return True

    def _stream(self, touched: list) -> None:
        for r in touched:
            group = self._owner.get(r.rid)
            if group is None or group.on_text is None or r.finished:
                continue
            dec = group.decoders[r.rid]
            delta = dec.add(r.output_ids[group.sent[r.rid]:])
            group.sent[r.rid] = len(r.output_ids)
            if delta:  # like the server's detokenizer: never show (the start of) a stop string
                shown = dec.text[:safe_text_len(dec.text, tuple(r.sampling.stop_strs))]
                try:
                    group.on_text(group.reqs.index(r), shown)
                except Exception:
                    logger.exception("stream callback failed")

    def _settle(self) -> None:
        still = []
        for g in self._groups:
            if all(r.finished for r in g.reqs):
                for r in g.reqs:
                    self._owner.pop(r.rid, None)
                try:
                    g.future.set_result([self.engine.result(r) for r in g.reqs])
                except Exception as e:
                    g.future.set_exception(e)
            else:
                still.append(g)
        self._groups = still

    def _fail_all(self, error: BaseException) -> None:
        self._dead = error
        for g in self._groups:
            if not g.future.done():
                g.future.set_exception(error)
        self._groups, self._owner = [], {}
        while True:  # fail what was queued meanwhile
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, _Group):
                item.future.set_exception(error)

    def _loop(self) -> None:
        sched = self.engine.scheduler
        try:
            while self._drain(block=not sched.has_work()):
                if sched.has_work():
                    self._stream(sched.step())
                self._settle()
        except BaseException as e:  # the scheduler broke: nothing can run any more
            logger.exception("engine driver stopped")
            self._fail_all(e)
            return
        self._fail_all(RuntimeError("engine driver closed"))
