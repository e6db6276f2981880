"""The scheduler's speculation strategy: what to propose for a request this decode step.

Contract: ``propose(req, k, cached)`` returns at most ``k`` token ids to verify after the
request's last token (``[]``: decode normally); ``cached(n)`` returns up to ``n`` tokens the
prefix cache holds right after the request's text (other requests' text).  ``record`` is
called once per verified proposal with how many of its tokens the target accepted.  A
speculator keeps its per-request state in ``req.spec_state`` (dropped with the request), so
it holds nothing itself.  The scheduler calls it only for requests that may speculate
(``scheduler/spec_steps.py`` decides which).  Scheduler thread only.
"""
from __future__ import annotations

from typing import Any, Callable, Protocol

from radixserve.speculative.gate import AcceptanceGate
from radixserve.speculative.ngram import NgramIndex

Cached = Callable[[int], list[int]]


class SpecRequest(Protocol):
    """What a speculator reads and writes of the scheduler's request."""

    fill_ids: list[int]
    spec_state: Any


class Speculator(Protocol):
    #: True when the worker's draft model writes the proposed tokens: ``propose`` then only
    #: says how many (its ids are placeholders)
    drafts_in_worker: bool

    def propose(self, req: SpecRequest, k: int, cached: Cached) -> list[int]: ...

    def record(self, req: SpecRequest, proposed: int, accepted: int) -> None: ...


class NoSpeculation:
    """``--speculative-algorithm none``: never proposes."""

    drafts_in_worker = False

    def propose(self, req: SpecRequest, k: int, cached: Cached) -> list[int]:
        return []

    def record(self, req: SpecRequest, proposed: int, accepted: int) -> None:
        pass


class _GateState:
    __slots__ = ("gate",)

    def __init__(self) -> None:
        self.gate = AcceptanceGate()


class _NgramState:
    __slots__ = ("index", "gate")

    def __init__(self) -> None:
        self.index = NgramIndex()
        self.gate = AcceptanceGate()


class NgramSpeculation:
    """``--speculative-algorithm ngram``: the continuation of the longest recent n-gram match in
    the request's own prompt + output, else what the prefix cache holds after its text."""

    drafts_in_worker = False

    def propose(self, req: SpecRequest, k: int, cached: Cached) -> list[int]:
        st = req.spec_state
        if st is None:
            st = req.spec_state = _NgramState()
        if not st.gate.open():
            return []
        st.index.sync(req.fill_ids)
        return st.index.propose(k) or cached(k)

    def record(self, req: SpecRequest, proposed: int, accepted: int) -> None:
        req.spec_state.gate.record(proposed, accepted)


class DraftModelSpeculation:
    """``--speculative-algorithm draft``: ``k`` tokens for the worker's draft model to propose
    (``worker/spec/draft_runner.py``) whenever the request's gate is open."""

    drafts_in_worker = True

    def propose(self, req: SpecRequest, k: int, cached: Cached) -> list[int]:
        if req.spec_state is None:
            req.spec_state = _GateState()
        return [0] * k if req.spec_state.gate.open() else []

    def record(self, req: SpecRequest, proposed: int, accepted: int) -> None:
        req.spec_state.gate.record(proposed, accepted)


def make_speculator(algorithm: str) -> Speculator:
    if algorithm == "ngram":
        return NgramSpeculation()
    if algorithm == "draft":
        return DraftModelSpeculation()
    if algorithm == "none":
        return NoSpeculation()
    raise ValueError(f"speculative_algorithm: unknown {algorithm!r}")
