"""One request's state over an outlines-core index (the ``GrammarState`` contract, fsm_state.py).

``state`` is the index state after every accepted token, ``prev`` the state before the last
one (None before the first).  Every query is a pure walk over the index from ``state`` or
``prev``; masks come from the grammar's per-state cache (outlines_backend.py).  An
outlines-core ``Guide`` follows the accepted tokens only to build masks faster; it is dropped
(and masks built from the index) if it ever gets out of step.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from radixserve.constrained.runtime.fsm_state import GrammarState


class OutlinesState(GrammarState):
    __slots__ = ("grammar", "vocab", "state", "prev", "guide")

    def __init__(self, grammar: Any) -> None:
        from outlines_core import Guide

        self.grammar = grammar
        self.vocab = grammar.vocab
        self.state: int = grammar.initial
        self.prev: Optional[int] = None
        self.guide = Guide(grammar.index, max_rollback=4)

    def _info(self) -> tuple[np.ndarray, bytes, bool]:
        return self.grammar.info(self.state, self.guide)

    def mask(self, ignore_eos: bool = False) -> np.ndarray:
        return self._no_eos(self._info()[0], self.is_accepting(), ignore_eos)

    def is_accepting(self) -> bool:
        return self.grammar.is_final(self.state)

    def has_token(self) -> bool:
        return self._info()[2]

    def forced(self) -> bytes:
        return self._info()[1]

    def accept(self, token: int) -> bool:
        nxt = self.grammar.next_state(self.state, token)
        if nxt is None:
            return False
        if self.guide is not None:
            try:
                self.guide.advance(token, return_tokens=False)
            except ValueError:
                self.guide = None
        self.prev, self.state = self.state, nxt
        return True

    @property
    def has_prev(self) -> bool:
        return self.prev is not None

    def _walk(self, tokens: list[int]) -> Optional[list[int]]:
        """States after each of ``tokens`` from ``prev``; None at the first invalid one."""
        states, s = [], self.prev
        for t in tokens:
            s = self.grammar.next_state(s, t)
            if s is None:
                return None
            states.append(s)
        return states

    def valid_from_prev(self, tokens: list[int]) -> bool:
        return self.prev is not None and self._walk(tokens) is not None

    def mask_from_prev(self, tokens: list[int]) -> np.ndarray:
        states = self._walk(tokens)
        assert states is not None, "mask_from_prev takes tokens valid from prev"
        return self.grammar.info(states[-1] if states else self.prev)[0]

    def splice(self, tokens: list[int]) -> None:
        states = self._walk(tokens)
        assert states, "splice takes tokens valid from prev"
        self.prev = ([self.prev] + states)[-2]
        self.state = states[-1]
        if self.guide is not None:
            try:  # keep the guide in step (it only speeds up mask building)
                self.guide.rollback_state(1)
                for t in tokens:
                    self.guide.advance(t, return_tokens=False)
            except (ValueError, RuntimeError):
                self.guide = None

    def masks_along(self, tokens: list[int], ignore_eos: bool = False) -> tuple[list[int], np.ndarray]:
        g, state = self.grammar, self.state
        masks = [self.mask(ignore_eos)]
        kept: list[int] = []
        for t in tokens:
            nxt = g.next_state(state, t) if masks[-1][t] and not self.vocab.eos_mask[t] else None
            if nxt is None:
                break
            kept.append(t)
            state = nxt
            masks.append(self._no_eos(g.info(state)[0], g.is_final(state), ignore_eos))
        return kept, np.stack(masks)
