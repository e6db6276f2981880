"""Prompt lookup: where did the request's last n tokens occur before, and what followed?

``NgramIndex`` maps every n-gram (``min_n <= n <= max_n``) of a growing token sequence to
the position right after its most recent earlier occurrence.  It is built once per request
(O(length)) and extended by the tokens appended since (O(new tokens)), so a proposal costs
a few dict look-ups, never a rescan.
"""
from __future__ import annotations

from typing import Sequence


class NgramIndex:
    def __init__(self, min_n: int = 2, max_n: int = 4) -> None:
        assert 1 <= min_n <= max_n
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = []
        self._next: dict[tuple[int, ...], int] = {}  # n-gram -> position of the token after it

    def sync(self, tokens: Sequence[int]) -> None:
        """Make the index cover ``tokens``, which extends what it covered (a sequence that
        does not, e.g. a rewritten output, is indexed anew)."""
        have = len(self.tokens)
        if have > len(tokens) or (have and tokens[have - 1] != self.tokens[-1]):
            self.tokens, self._next = [], {}
            have = 0
        for t in tokens[have:]:
            self._push(t)

    def _push(self, token: int) -> None:
        toks, i = self.tokens, len(self.tokens)
        # the n-grams ending just before ``token`` now have a known continuation
        for n in range(self.min_n, min(self.max_n, i) + 1):
            self._next[tuple(toks[i - n: i])] = i
        toks.append(token)

    def propose(self, k: int) -> list[int]:
        """Up to ``k`` tokens that followed the most recent earlier occurrence of the longest
        matching suffix (``max_n`` down to ``min_n`` tokens); [] when none occurred."""
        toks, size = self.tokens, len(self.tokens)
        for n in range(min(self.max_n, size), self.min_n - 1, -1):
            pos = self._next.get(tuple(toks[size - n:]))
            if pos is not None:
                return toks[pos: pos + k]
        return []
