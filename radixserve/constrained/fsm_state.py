"""Per-request FSM state of a constrained request.

Contract:
- ``state`` is the outlines-core index state after every token of ``req.output_ids``
  (``GrammarManager.after_token`` calls ``accept`` for each emitted token; the scheduler
  calls ``splice`` when it applies a ``Jump``);
  ``prev`` is the state before the last output token (None before the first).
- ``mask(ignore_eos)`` is the allowed-token mask for the next sample (shared: never modify it;
  EOS ids only in accepting states, never with ``ignore_eos``).
- ``accept(token)`` advances and returns True, or returns False and leaves the state
  unchanged when the token is not a valid transition (EOS included: EOS ends the request
  instead of advancing).
- ``outcome()`` after a token: None (keep going), "complete" (accepting and nothing
  but EOS can follow) or "dead" (no token can follow: the request cannot be finished).
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np


class GrammarState:
    __slots__ = ("grammar", "state", "prev", "guide")

    def __init__(self, grammar: Any) -> None:
        from outlines_core import Guide

        self.grammar = grammar
        self.state: int = grammar.initial
        self.prev: Optional[int] = None
        self.guide = Guide(grammar.index, max_rollback=4)

    def _info(self) -> tuple[np.ndarray, bytes, bool]:
        return self.grammar.info(self.state, self.guide)

    def mask(self, ignore_eos: bool = False) -> np.ndarray:
        m = self._info()[0]
        if ignore_eos and self.grammar.is_final(self.state):
            m = m & ~self.grammar.vocab.eos_mask
        return m

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

    def splice(self, new_tokens: list[int], states: list[int]) -> None:
        """The last output token was replaced by ``new_tokens`` (valid from ``prev``, with the
        states after each of them)."""
        self.prev = ([self.prev] + states)[-2]
        self.state = states[-1]
        if self.guide is not None:
            try:  # keep the guide in step (it only speeds up mask building)
                self.guide.rollback_state(1)
                for t in new_tokens:
                    self.guide.advance(t, return_tokens=False)
            except (ValueError, RuntimeError):
                self.guide = None

    def masks_along(self, tokens: list[int], ignore_eos: bool = False) -> tuple[list[int], np.ndarray]:
        """Speculative decoding: the longest prefix of ``tokens`` the grammar accepts from the
        current state (cut at the first rejected token or EOS), and the allowed-token masks
        ``[len(prefix) + 1, vocab]`` before each of its tokens and after the last.  Changes
        nothing (states are walked on a scratch copy, masks built without the guide)."""
        g, state = self.grammar, self.state
        masks = [self.mask(ignore_eos)]
        kept: list[int] = []
        for t in tokens:
            nxt = g.next_state(state, t) if masks[-1][t] and not g.vocab.eos_mask[t] else None
            if nxt is None:
                break
            kept.append(t)
            state = nxt
            m = g.info(state)[0]
            masks.append(m & ~g.vocab.eos_mask if ignore_eos and g.is_final(state) else m)
        return kept, np.stack(masks)

    def outcome(self) -> Optional[str]:
        if self._info()[2]:
            return None
        return "complete" if self.grammar.is_final(self.state) else "dead"
