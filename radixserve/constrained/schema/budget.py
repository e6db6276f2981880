"""Finishing a constrained output within its token budget (``constraint_budget: "close"``).

By default a constrained request that reaches ``max_new_tokens`` is cut where it stands (a JSON
document without its closing brackets).  With ``"close"``, once the tokens left are about what it
takes to close what is open and write what is still required (``reserve``: twice the open
brackets, plus one for an open string, plus ``SLACK``, plus half the budget: on JSONSchemaBench a
small model that ran out had mostly written one value at length, with required properties still
to come; at 384 tokens half finished 165 of 182 schemas, a quarter 164 with integer bounds
added), the mask is narrowed to the allowed tokens of the first non-empty class of:

1. EOS (the output is complete);
2. inside a string: tokens that end it, a ``"`` and then only ``]``/``}`` (``"``, ``"}``, ``"]}``);
   outside: tokens of only ``]``/``}`` characters;
3. a lone ``"`` (where a key must start, it starts the required key);
4. the shortest values: ``0``, ``null``, ``true``, ``false``, ``""``, ``[]``, ``{}``;
5. everything the grammar allows (the model's own choice: a ``,`` before a required key, a
   ``minLength``).

It only ever removes tokens from the grammar's mask, so the output stays valid; it is a steer, not
a guarantee (a schema may need more tokens than are left).  The open brackets are counted on the
output's bytes (outside strings, escapes honoured).
"""
from __future__ import annotations

import re
from typing import Any, Sequence

import numpy as np

SLACK = 8
SHARE = 2  # and half the budget: what is still required after the open brackets
MAX_RESERVE = 256  # never more tokens than this are kept back
MODES = ("cut", "close")
_CLOSERS = re.compile(rb'^\s*(?:[\]}]\s*)+$')
_STRING_END = re.compile(rb'^"\s*(?:[\]}]\s*)*$')
_SHORT = {b"0", b"null", b"true", b"false", b'""', b"[]", b"{}", b" 0", b" null", b" true", b" false", b' ""'}
_classes: dict[int, tuple[np.ndarray, ...]] = {}


def _token_classes(vocab: Any) -> tuple[np.ndarray, ...]:
    """(string enders, bracket closers, lone quote, short values) masks over the vocabulary (built
    once per vocabulary)."""
    key = id(vocab)
    if key not in _classes:
        tb = vocab.token_bytes
        masks = tuple(np.zeros(vocab.size, dtype=bool) for _ in range(4))
        for t, b in enumerate(tb):
            if not b:
                continue
            masks[0][t] = bool(_STRING_END.match(b))
            masks[1][t] = bool(_CLOSERS.match(b))
            masks[2][t] = b.strip() == b'"'
            masks[3][t] = b in _SHORT
        _classes[key] = masks
    return _classes[key]


def nesting(data: bytes) -> tuple[int, bool]:
    """(open ``[``/``{`` outside strings, inside a string) after ``data``."""
    depth, in_str, esc = 0, False, False
    for c in data:
        if in_str:
            if esc:
                esc = False
            elif c == 0x5C:  # backslash
                esc = True
            elif c == 0x22:
                in_str = False
        elif c == 0x22:
            in_str = True
        elif c in (0x5B, 0x7B):
            depth += 1
        elif c in (0x5D, 0x7D):
            depth = max(0, depth - 1)
    return depth, in_str


def _state(output_ids: Sequence[int], vocab: Any) -> tuple[int, bool]:
    return nesting(b"".join(vocab.token_bytes[t] or b"" for t in output_ids if 0 <= t < vocab.size))


def _reserve(depth: int, in_str: bool, budget: int) -> int:
    return 2 * depth + int(in_str) + SLACK + budget // SHARE


def reserve(output_ids: Sequence[int], vocab: Any, budget: int = 0) -> int:
    """Tokens kept back for closing the output so far, of a ``budget`` of new tokens."""
    return _reserve(*_state(output_ids, vocab), budget)


def closing_mask(mask: np.ndarray, vocab: Any, output_ids: Sequence[int], remaining: int) -> np.ndarray:
    """``mask`` narrowed as the module docstring says when ``remaining`` tokens are within the
    reserve; ``mask`` itself (not a copy) otherwise.  Never adds a token."""
    if remaining > MAX_RESERVE:
        return mask
    depth, in_str = _state(output_ids, vocab)
    if remaining > _reserve(depth, in_str, remaining + len(output_ids)):
        return mask
    eos = mask & vocab.eos_mask
    if eos.any():
        return eos
    ends, closers, quote, short = _token_classes(vocab)
    for cls in ((ends,) if in_str else (closers, quote, short)):
        narrowed = mask & cls
        if narrowed.any():
            return narrowed
    return mask
