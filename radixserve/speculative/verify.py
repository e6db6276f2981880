"""Acceptance rules for proposed tokens, given the target's distributions at each position.

A verify step feeds ``[last, d_1 .. d_k]`` through the target; row ``j`` of its output is the
target's next-token distribution after ``d_1 .. d_j``.  Both rules return the emitted tokens:
the accepted prefix ``d_1 .. d_m`` followed by exactly one token of the target's (the
correction at the first rejection, or the bonus token after ``d_k``), so every verify step
emits between 1 and ``k + 1`` tokens.

* ``greedy_accept``: accept while ``d_j`` equals the target's argmax; the output is the target's
  greedy output token for token.
* ``rejection_accept`` (Leviathan et al. 2023; Chen et al. 2023): accept ``d_j`` with
  probability ``min(1, p_j(d_j) / q_j(d_j))``; on rejection emit a sample of the residual
  ``max(p_j - q_j, 0)`` (normalised) and stop.  Each emitted token is then distributed exactly
  as ``p``.  For a point-mass proposal (n-gram, ``q`` None) that is: accept with ``p_j(d_j)``,
  else sample ``p_j`` with ``d_j`` removed.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch


def greedy_accept(drafts: Sequence[int], target: Sequence[int]) -> list[int]:
    """``target[j]``: the target's greedy token at row ``j`` (``len(drafts) + 1`` rows)."""
    m = 0
    while m < len(drafts) and drafts[m] == target[m]:
        m += 1
    return list(drafts[:m]) + [int(target[m])]


def sample_from(weights: torch.Tensor, gen: torch.Generator) -> int:
    """One draw from the unnormalised non-negative ``weights`` [V] (exponential race)."""
    noise = torch.empty_like(weights).exponential_(generator=gen)
    return int(torch.argmax(weights / noise))


def rejection_accept(probs: torch.Tensor, drafts: Sequence[int], gens: Sequence[torch.Generator],
                     draft_probs: Optional[torch.Tensor] = None) -> list[int]:
    """``probs`` [k + 1, V]: the target's (processed) distributions; ``draft_probs``
    [k, V] the proposer's, None for a point mass; ``gens[j]`` the randomness of row ``j``."""
    probs = probs / probs.sum(dim=-1, keepdim=True)  # top-k/top-p/min-p zero entries, unnormalised
    out: list[int] = []
    for j, d in enumerate(drafts):
        p = probs[j]
        q_d = 1.0 if draft_probs is None else float(draft_probs[j, d])
        u = float(torch.rand((), generator=gens[j], device=p.device))
        if u * q_d < float(p[d]):  # u < p/q without dividing by a zero q
            out.append(int(d))
            continue
        if draft_probs is None:
            residual = p.clone()
            residual[d] = 0.0
        else:
            residual = (p - draft_probs[j]).clamp_min_(0.0)
        if float(residual.sum()) <= 0.0:  # p == q: nothing left to correct (u < 1 always accepts)
            residual = p
        out.append(sample_from(residual, gens[j]))
        return out
    out.append(sample_from(probs[len(drafts)], gens[len(drafts)]))
    return out
