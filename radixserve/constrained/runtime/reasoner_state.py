"""A grammar deferred while its request thinks (SGLang's ``ReasonerGrammarObject``, vLLM's
``is_reasoning_end``): the ``GrammarState`` of a request whose output starts inside a reasoning
model's thinking block (``SamplingParams.require_reasoning``).

While thinking, nothing is masked (``mask`` is None), every token is accepted, nothing is forced
(``forced`` is b"", ``has_prev`` false: jump-forward never fires) and the request never completes on
the grammar's account.  The think-end token (one id: ``reasoning.formats.think_token_ids``) ends the
thinking; from the next token on, every call goes to ``inner``, the request's compiled grammar,
fresh from its start state, so the constraint applies to the answer alone.  ``inner`` None (a
thinking budget without a constraint) leaves the answer unconstrained.  ``budget`` (the request's
``thinking_token_budget``): once that many thinking tokens were accepted, the mask allows the
think-end token only.  ``answer_start`` is the index in the output of the first answer token (None
while thinking), for readers of the answer's tokens (the ``"close"`` budget's steering).
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from radixserve.constrained.runtime.fsm_state import GrammarState


class ReasonerState(GrammarState):
    def __init__(self, inner: Optional[GrammarState], end_id: int, vocab_size: int,
                 budget: Optional[int] = None, eos_ids: tuple[int, ...] = ()) -> None:
        self.inner = inner
        self.eos_ids = frozenset(eos_ids)
        self.end_id = end_id
        self.vocab_size = vocab_size
        self.budget = budget
        self.thinking = True
        self.think_tokens = 0  # accepted tokens before the think-end token
        self._answer_start: Optional[int] = None
        if inner is not None:
            self.vocab = inner.vocab
        self._end_only: Optional[np.ndarray] = None
        self._all: Optional[np.ndarray] = None

    @property
    def answer_start(self) -> Optional[int]:  # type: ignore[override]
        return self._answer_start

    def _think_mask(self, count: int) -> Optional[np.ndarray]:
        """The mask of a thinking step after ``count`` thinking tokens: the end token only once the
        budget is spent, else None (nothing masked)."""
        if self.budget is None or count < self.budget:
            return None
        if self._end_only is None:
            self._end_only = np.zeros(self.vocab_size, dtype=bool)
            self._end_only[self.end_id] = True
        return self._end_only

    def mask(self, ignore_eos: bool = False) -> Optional[np.ndarray]:  # type: ignore[override]
        if self.thinking:
            return self._think_mask(self.think_tokens)
        return None if self.inner is None else self.inner.mask(ignore_eos)

    def is_accepting(self) -> bool:
        if self.thinking:
            return False
        return True if self.inner is None else self.inner.is_accepting()

    def has_token(self) -> bool:
        if self.thinking:
            return True
        return True if self.inner is None else self.inner.has_token()

    def accept(self, token: int) -> bool:
        if self.thinking:
            allowed = self._think_mask(self.think_tokens)
            if allowed is not None and not allowed[token]:
                return False
            if token == self.end_id:
                self.thinking = False
                self._answer_start = self.think_tokens + 1
            else:
                self.think_tokens += 1
            return True
        return True if self.inner is None else self.inner.accept(token)

    def splice(self, tokens: list[int]) -> None:
        assert not self.thinking and self.inner is not None, "jump-forward never fires while thinking"
        self.inner.splice(tokens)

    def forced(self) -> bytes:
        return b"" if self.thinking or self.inner is None else self.inner.forced()

    @property
    def has_prev(self) -> bool:
        return not self.thinking and self.inner is not None and self.inner.has_prev

    def valid_from_prev(self, tokens: list[int]) -> bool:
        assert self.inner is not None and not self.thinking
        return self.inner.valid_from_prev(tokens)

    def mask_from_prev(self, tokens: list[int]) -> np.ndarray:
        assert self.inner is not None and not self.thinking
        return self.inner.mask_from_prev(tokens)

    def _full(self) -> np.ndarray:
        if self._all is None:
            self._all = np.ones(self.vocab_size, dtype=bool)
        return self._all

    def masks_along(self, tokens: list[int], ignore_eos: bool = False) -> tuple[list[int], np.ndarray]:
        """As the contract says; the thinking rows allow every token (the end token only past the
        budget), and after a think-end token in ``tokens`` the inner grammar's masks follow."""
        if not self.thinking:
            if self.inner is not None:
                return self.inner.masks_along(tokens, ignore_eos)
            return list(tokens), np.stack([self._full()] * (len(tokens) + 1))
        kept: list[int] = []
        rows: list[np.ndarray] = []
        count = self.think_tokens
        for i, t in enumerate(tokens):
            m = self._think_mask(count)
            row = self._full() if m is None else m
            if not row[t] or t in self.eos_ids:
                break
            rows.append(row)
            kept.append(t)
            if t == self.end_id:  # the answer starts: the inner grammar masks the rest
                if self.inner is None:
                    rest = list(tokens[i + 1:])
                    return kept + rest, np.stack(rows + [self._full()] * (len(rest) + 1))
                more, masks = self.inner.masks_along(list(tokens[i + 1:]), ignore_eos)
                return kept + more, np.concatenate([np.stack(rows), masks])
            count += 1
        m = self._think_mask(count)
        rows.append(self._full() if m is None else m)
        return kept, np.stack(rows)
