"""Jump-forward decoding: find forced text and splice it in with a re-tokenized boundary.

Contract (backend-independent: it reads only the ``GrammarState`` contract, fsm_state.py):
- ``plan_jump(req, gs, vocab)`` returns the tokens that replace the request's last output
  token (just sampled, so its KV is not computed yet and nothing has to be freed), or
  None.  They are the tokenizer's own encoding of that token's text plus ``gs.forced()``
  (minus the last token when a longer allowed token starts with it: that boundary is left
  to the model), so the output stays a tokenization the model would produce; they are only
  used when their bytes equal that text exactly and all of them are valid from the state
  before the replaced token (``gs.valid_from_prev``).  A jump is never made when it would
  emit a stop token id or a stop string (the normal stop check must see those), when
  logprobs are requested (forced tokens are not sampled), or past ``max_new_tokens`` (the
  new tokens are cut to fit).
- Where forced text comes from is the backend's business: llguidance computes it
  (``LLMatcher.compute_ff_bytes``); for outlines-core, ``forced_bytes(grammar, state,
  allowed)`` finds it on the token-level index: while every allowed token starts with the
  same byte (one vectorized check over their first bytes), the common prefix of the allowed
  tokens is forced; when that prefix is itself an allowed token the walk continues from the
  state it leads to.  It stops at accepting states (EOS would be allowed) and after
  ``MAX_FORCED`` bytes.
"""
from __future__ import annotations

import os
from typing import Any, Optional

import numpy as np

from radixserve.constrained.runtime.fsm_state import GrammarState
from radixserve.constrained.protocols import GrammarRequest
from radixserve.constrained.runtime.vocab import TokenVocab

MAX_FORCED = 512  # bytes of forced text found per state


def forced_bytes(grammar: Any, state: int, allowed: np.ndarray) -> bytes:
    vocab = grammar.vocab
    out = b""
    for _ in range(MAX_FORCED):
        if state in grammar.finals or allowed.size == 0:
            break
        fb = vocab.first_byte[allowed]
        if fb[0] < 0 or (fb != fb[0]).any():
            break
        toks = [vocab.token_bytes[i] for i in allowed.tolist()]
        lcp = os.path.commonprefix(toks)
        out += lcp
        exact = [i for i, b in zip(allowed.tolist(), toks) if b == lcp]
        if not exact or len(out) >= MAX_FORCED:
            break
        state = grammar.next_state(state, exact[0])
        if state is None:
            break
        allowed = grammar.allowed_ids(state)
    return out


def _may_merge(mask: np.ndarray, vocab: TokenVocab, tail: bytes) -> bool:
    """Whether a longer allowed token (in ``mask``) starts with ``tail``: the text after the
    forced part may merge with the last forced token (the model writes '":' rather than
    '"' + ':'), so that token is held back and the model samples the boundary itself."""
    ids = np.flatnonzero(mask & (vocab.first_byte == tail[0]))
    return any(len(b) > len(tail) and b.startswith(tail) for b in (vocab.token_bytes[i] for i in ids.tolist()))


def _utf8_text(tb: bytes, forced: bytes) -> Optional[tuple[str, bytes]]:
    """Decode ``tb + forced``, dropping up to 3 trailing bytes of ``forced`` that cut a
    character in half."""
    for cut in range(0, 4):
        f = forced[: len(forced) - cut] if cut else forced
        if not f:
            return None
        try:
            return (tb + f).decode("utf-8"), tb + f
        except UnicodeDecodeError:
            continue
    return None


def plan_jump(req: GrammarRequest, gs: GrammarState, vocab: TokenVocab) -> Optional[list[int]]:
    sp = req.sampling
    if req.return_logprob or not req.output_ids or not gs.has_prev:
        return None
    forced = gs.forced()
    if not forced:
        return None
    last = req.output_ids[-1]
    tb = vocab.token_bytes[last] if 0 <= last < vocab.size else None
    if tb is None:
        return None
    dec = _utf8_text(tb, forced)
    if dec is None:
        return None
    text, want = dec
    new = vocab.encode(text)
    if not new or vocab.text_bytes(new) != want:
        return None
    if not gs.valid_from_prev(new):
        return None
    if len(new) > 1 and _may_merge(gs.mask_from_prev(new[:-1]), vocab, vocab.token_bytes[new[-1]]):
        new = new[:-1]
    room = sp.max_new_tokens - (len(req.output_ids) - 1)
    new = new[:max(room, 0)]
    if not new or new == [last]:
        return None
    if sp.stop_token_ids and any(t in sp.stop_token_ids for t in new):
        return None
    stops = sp.stop_strs
    if stops:
        window = max(len(x) for x in stops) + 2
        before = vocab.text_bytes(req.output_ids[-window - 1:-1]) or b""
        joined = (before + vocab.text_bytes(new)).decode("utf-8", "replace")
        if any(x in joined for x in stops):
            return None
    return new
