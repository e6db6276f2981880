"""Embedding requests in the scheduler: what each step asks the worker to pool, and the sum.

An embedding request (``Req.pooling`` "last" or "mean") is a prompt with
``max_new_tokens == 0``: it is prefilled (in chunks like any prompt), never samples, and
finishes with finish_reason ``length`` once its last prompt token is computed; its KV goes
to the prefix cache like any finished request's.

"last" reads the hidden state of the last prompt token only, so a cached prefix is reused
(at least one token is always computed).  "mean" needs every position's hidden state, which
the cache does not keep: its prefix match is empty (``Req.prefix_match_limit``), so the
whole prompt is computed; it is still inserted into the cache at the end, where tokens the
cache already held are deduplicated.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from radixserve.scheduler.req import Req


def pool_mode(req: Req, start: int, n: int) -> str:
    """``StepReq.pool`` for the chunk ``[start, start + n)`` of ``req``."""
    if req.pooling == "mean":
        return "sum"
    return "last" if start + n == len(req.input_ids) else ""


def add_pooled(req: Req, start: int, hidden: np.ndarray) -> None:
    """Fold a step's pooled rows in; a chunk from position 0 starts over (after a retraction
    the prompt is computed again from the start)."""
    req.pooled = hidden if start == 0 or req.pooled is None else req.pooled + hidden


def embedding_of(req: Req) -> Optional[np.ndarray]:
    """The pooled (not normalized) float32 embedding of a finished embedding request, or None
    (aborted before its last chunk)."""
    if req.pooled is None or req.finish_reason is None or req.finish_reason.get("type") != "length":
        return None
    vec = req.pooled / len(req.input_ids) if req.pooling == "mean" else req.pooled
    return np.asarray(vec, dtype=np.float32)
