"""One constrained request's grammar state: the contract both backends implement.

A ``GrammarState`` follows ``req.output_ids`` token by token; it is grammar-owned (the
scheduler never touches its insides).  Who calls what (scheduler thread only):
- ``GrammarManager.after_token`` calls ``accept(token)`` for each emitted token: it advances
  and returns True, or returns False and leaves the state unchanged when the token is not a
  valid continuation (EOS included: EOS ends the request instead of advancing).
- the scheduler calls ``splice(tokens)`` when it applies a ``Jump``: the last accepted token
  is replaced by ``tokens`` (valid from the state before it; ``plan_jump`` checked them).
- ``mask(ignore_eos)`` is the allowed-token mask for the next sample, ``bool[vocab_size]``
  (callers never modify it; it may be shared): EOS ids only in accepting states and never
  with ``ignore_eos``; special tokens never.  None means nothing is masked this step (only a
  grammar deferred while its request thinks, ``reasoner_state.py``, returns it).
- ``answer_start``: the index in the output of the first token the grammar constrains (0; a
  deferred grammar's is None until its request's thinking ends).
- ``outcome()``: None (keep going), "complete" (accepting and nothing but EOS can follow) or
  "dead" (no token can follow: the request cannot be finished).
- jump-forward (``jump_forward.plan_jump``) reads ``forced()`` (bytes every continuation
  must start with; b"" in accepting states), ``has_prev`` (a token was accepted and may be
  replaced), ``valid_from_prev(tokens)`` and ``mask_from_prev(tokens)`` (the tokens replace
  the last one: are they all valid, and the mask after them); these change nothing.
- speculative decoding reads ``masks_along(tokens, ignore_eos)``: the longest prefix of
  ``tokens`` the grammar accepts (cut at the first rejected token or EOS) and the masks
  ``[len(prefix) + 1, vocab]`` before each of its tokens and after the last; changes nothing.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Optional

import numpy as np

from radixserve.constrained.runtime.vocab import TokenVocab


def finish_mask(mask: np.ndarray, vocab: TokenVocab, accepting: bool) -> np.ndarray:
    """``mask`` (modified in place) with EOS allowed exactly when ``accepting``."""
    mask &= ~vocab.eos_mask
    if accepting:
        mask |= vocab.eos_mask
    return mask


class GrammarState(ABC):
    vocab: TokenVocab
    answer_start: Optional[int] = 0

    @abstractmethod
    def mask(self, ignore_eos: bool = False) -> Optional[np.ndarray]: ...

    @abstractmethod
    def is_accepting(self) -> bool: ...

    @abstractmethod
    def has_token(self) -> bool:
        """Some non-EOS token may follow."""

    @abstractmethod
    def accept(self, token: int) -> bool: ...

    @abstractmethod
    def splice(self, tokens: list[int]) -> None: ...

    @abstractmethod
    def forced(self) -> bytes: ...

    @property
    @abstractmethod
    def has_prev(self) -> bool: ...

    @abstractmethod
    def valid_from_prev(self, tokens: list[int]) -> bool: ...

    @abstractmethod
    def mask_from_prev(self, tokens: list[int]) -> np.ndarray: ...

    @abstractmethod
    def masks_along(self, tokens: list[int], ignore_eos: bool = False) -> tuple[list[int], np.ndarray]: ...

    def outcome(self) -> Optional[str]:
        if self.has_token():
            return None
        return "complete" if self.is_accepting() else "dead"

    def _no_eos(self, mask: np.ndarray, accepting: bool, ignore_eos: bool) -> np.ndarray:
        return mask & ~self.vocab.eos_mask if ignore_eos and accepting else mask
