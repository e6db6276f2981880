"""Cutting a step plan into micro-batches (by requests, in order).

A pipeline stage can work on micro-batch ``k + 1`` while the next stage works on ``k``; the
cut keeps requests whole and in their order (so the results concatenate back to the plan's
order) and balances the tokens: each cut falls where the running token count first reaches
its share.  Only the first micro-batch carries the plan's ``release`` list.
"""
from __future__ import annotations

from dataclasses import replace

from radixserve.ipc.worker_link import StepPlan


def split_plan(plan: StepPlan, parts: int) -> list[StepPlan]:
    """At most ``parts`` non-empty micro-batches of ``plan`` (one plan, maybe without requests,
    when it has fewer than two requests or ``parts`` is 1)."""
    n = len(plan.reqs)
    parts = max(1, min(parts, n))
    if parts == 1:
        return [plan]
    sizes = [len(r.input_ids) for r in plan.reqs]
    total = sum(sizes)
    cuts, seen, k = [0], 0, 1
    for i, size in enumerate(sizes):
        seen += size
        left_reqs, left_parts = n - (i + 1), parts - k
        # cut after request i when its share is reached, or when every later request must stand alone
        if k < parts and (seen * parts >= total * k or left_reqs == left_parts) and left_reqs >= left_parts > 0:
            cuts.append(i + 1)
            k += 1
    cuts.append(n)
    return [replace(plan, reqs=plan.reqs[a:b], release=plan.release if j == 0 else [])
            for j, (a, b) in enumerate(zip(cuts, cuts[1:]))]
