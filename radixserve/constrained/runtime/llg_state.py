"""One request's state over an llguidance ``LLMatcher`` (the ``GrammarState`` contract, fsm_state.py).

The matcher is stateful (no integer states to cache masks by): it consumes each accepted
token, and the queries that look at another position (jump-forward's ``valid_from_prev`` /
``mask_from_prev``, speculation's ``masks_along``) roll it back or forward and restore it
before returning, so from the outside they change nothing.  The mask of the current
position is computed once (``fill_next_token_bitmask`` into this state's own int32 buffer,
then one ``np.unpackbits``) and reused until the next token; special tokens are never
allowed and EOS exactly in accepting states, as with outlines.  Forced text is llguidance's
own (``compute_ff_bytes``).
"""
from __future__ import annotations

import time
from typing import Any, Optional

import numpy as np

from radixserve.constrained.runtime.fsm_state import GrammarState, finish_mask


def _ok(done: bool, m: Any, what: str) -> None:
    """Matcher calls with side effects are checked here, never inside ``assert``."""
    if not done:
        raise RuntimeError(f"llguidance matcher: {what} failed: {m.get_error()}")


class LLGuidanceState(GrammarState):
    __slots__ = ("m", "backend", "vocab", "count", "last", "_buf", "_cur", "_normal")

    def __init__(self, matcher: Any, backend: Any) -> None:
        self.m = matcher
        self.backend = backend
        self.vocab = backend.vocab
        self.count = 0  # tokens accepted
        self.last: Optional[int] = None
        self._buf = np.zeros((1, (self.vocab.size + 31) // 32), dtype=np.int32)
        self._cur: Optional[tuple[np.ndarray, bool]] = None  # (mask, has_token) at the current position
        self._normal = self.vocab.first_byte >= 0  # tokens with text (not special, not padding)

    # ------------------------------------------------------------------ masks
    def _raw_mask(self) -> np.ndarray:
        from llguidance.numpy import fill_next_token_bitmask

        t0 = time.perf_counter()
        fill_next_token_bitmask(self.m, self._buf)
        V = self.vocab.size
        mask = np.unpackbits(self._buf[0].view(np.uint8), bitorder="little")[:V].astype(bool)
        mask &= self._normal
        finish_mask(mask, self.vocab, self.m.is_accepting())
        self.backend.mask_build_seconds.append(time.perf_counter() - t0)
        return mask

    def _info(self) -> tuple[np.ndarray, bool]:
        if self._cur is None:
            mask = self._raw_mask()
            self._cur = (mask, bool((mask & ~self.vocab.eos_mask).any()))
        else:
            self.backend.mask_hits += 1
        return self._cur

    def mask(self, ignore_eos: bool = False) -> np.ndarray:
        return self._no_eos(self._info()[0], self.is_accepting(), ignore_eos)

    def is_accepting(self) -> bool:
        return self.m.is_accepting()

    def has_token(self) -> bool:
        return self._info()[1]

    def forced(self) -> bytes:
        return b"" if self.m.is_accepting() else self.m.compute_ff_bytes()

    # ------------------------------------------------------------------ advancing
    def _valid(self, token: int) -> bool:
        return 0 <= token < self.vocab.size and not self.vocab.eos_mask[token] and self.m.validate_tokens([token]) == 1

    def accept(self, token: int) -> bool:
        if not self._valid(token) or not self.m.consume_token(token):
            return False
        self.count += 1
        self.last = token
        self._cur = None
        return True

    @property
    def has_prev(self) -> bool:
        return self.count > 0

    def _back(self) -> None:
        """Roll the last accepted token back (the caller restores it with ``_redo``)."""
        _ok(self.last is not None and self.m.rollback(1), self.m, "rollback")

    def _redo(self) -> None:
        _ok(self.last is not None and self.m.consume_token(self.last), self.m, "redo")

    def valid_from_prev(self, tokens: list[int]) -> bool:
        if not self.count:
            return False
        self._back()
        try:
            return self.m.validate_tokens(tokens) == len(tokens)
        finally:
            self._redo()

    def mask_from_prev(self, tokens: list[int]) -> np.ndarray:
        self._back()
        try:
            _ok(self.m.consume_tokens(tokens), self.m, "mask_from_prev (tokens valid from prev)")
            mask = self._raw_mask()
            _ok(self.m.rollback(len(tokens)), self.m, "rollback")
            return mask
        finally:
            self._redo()

    def splice(self, tokens: list[int]) -> None:
        self._back()
        _ok(self.m.consume_tokens(tokens), self.m, "splice (tokens valid from prev)")
        self.count += len(tokens) - 1
        self.last = tokens[-1]
        self._cur = None

    def masks_along(self, tokens: list[int], ignore_eos: bool = False) -> tuple[list[int], np.ndarray]:
        masks = [self.mask(ignore_eos)]
        kept: list[int] = []
        try:
            for t in tokens:
                if not masks[-1][t] or not self._valid(t) or not self.m.consume_token(t):
                    break
                kept.append(t)
                masks.append(self._no_eos(self._raw_mask(), self.m.is_accepting(), ignore_eos))
        finally:
            if kept:
                _ok(self.m.rollback(len(kept)), self.m, "rollback")
        return kept, np.stack(masks)
