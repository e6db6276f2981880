"""What the Engine's request groups get from scheduler steps (the stepping thread only).

A group is the requests of one ``Engine`` call and a ``Future`` of their native result dicts.
Each request's progress goes through the server's output path: ``take_output`` (token
deltas) -> ``DetokState`` (incremental, stop-string-safe text) -> ``OutputState`` (the shared
native-response builder).  A streaming group's ``on_update(state)`` runs each time a
request's visible text grows and once when it finishes; a group's future settles when all its
requests have finished.
"""
from __future__ import annotations

import logging
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


def settle(fut: Future, result: Any = None, error: Optional[BaseException] = None) -> None:
    """Set a future's outcome unless the caller cancelled it (e.g. a cancelled asyncio task)."""
    try:
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)
    except InvalidStateError:
        pass


@dataclass
class Track:
    req: Req
    detok: DetokState
    state: OutputState
    group: "Group"


@dataclass
class Group:
    reqs: list[Req]
    future: Future
    on_update: Optional[OnUpdate]
    tracks: list[Track] = field(default_factory=list)
    remaining: int = 0


class GroupTracker:
    """The groups whose requests are in the scheduler, by request id.  Not thread-safe: only
    the thread that steps the scheduler calls it."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._tracks: dict[str, Track] = {}

    def add(self, group: "Group", scheduler: Scheduler) -> None:
        """Queue the group's requests in ``scheduler``; a refused one fails the whole group."""
        added: list[Req] = []
        try:
            for r in group.reqs:
                scheduler.add_request(r)
                added.append(r)
        except Exception as e:
            for r in added:
                scheduler.abort(r.rid, "a request of the same group was refused")
            settle(group.future, error=e)
            return
        for i, r in enumerate(group.reqs):
            state = OutputState(r.rid, i, r.input_ids, r.return_logprob, r.logprob_start_len, r.top_logprobs_num)
            track = Track(r, DetokState(self.tokenizer, r.sampling.skip_special_tokens,
                                         tuple(r.sampling.stop_strs)), state, group)
            group.tracks.append(track)
            self._tracks[r.rid] = track
        group.remaining = len(group.reqs)
        if not group.reqs:
            settle(group.future, [])

    def deliver(self, reqs: list[Req]) -> None:
        """Fold the progress of ``reqs`` (touched by a step, or finished) into their groups."""
        now = time.perf_counter()
        for rid, req in {r.rid: r for r in reqs}.items():
            track = self._tracks.get(rid)
            if track is None or (track.group.on_update is None and not req.finished):
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
                    settle(group.future, [t.state.to_native() for t in group.tracks])

    def fail_all(self, error: BaseException) -> None:
        for track in self._tracks.values():
            settle(track.group.future, error=error)
        self._tracks = {}
