"""Embeddings in the worker: one forward that also returns pooled final hidden states.

Only steps with a pooling request (``StepReq.pool``) come here; every other step runs the
model's plain ``forward`` (no extra rows, no copies).  The hidden states are the model's
final-normed ones (what the LM head reads), pooled in fp32: "last" is the chunk's last row,
"sum" the sum over the chunk's rows (the scheduler adds the chunks up and divides).
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from radixserve.ipc.worker_link import StepOutput, StepReq


def forward_pooled(model: Any, batch: Any, backend: Any, logit_rows: list[int], pools: list[tuple[int, int, int]],
                   reqs: list[StepReq], outputs: list[StepOutput]) -> Optional[torch.Tensor]:
    """Run ``model`` over ``batch``; fill ``outputs[i].hidden`` for every ``(i, offset, n)`` of
    ``pools`` (request ``i``'s tokens are rows ``[offset, offset + n)``).  Returns the logits
    of ``logit_rows`` (None when there are none)."""
    rows = list(logit_rows)
    spans = []
    for i, offset, n in pools:
        picked = [offset + n - 1] if reqs[i].pool == "last" else list(range(offset, offset + n))
        spans.append((i, len(rows), len(rows) + len(picked)))
        rows.extend(picked)
    dev = batch.input_ids.device
    hidden = model.final_hidden(batch, backend, torch.tensor(rows, dtype=torch.int64, device=dev))
    if hidden is None:  # a pipeline stage other than the last
        return None
    for i, a, b in spans:
        outputs[i].hidden = hidden[a:b].float().sum(0).cpu().numpy()
    if not logit_rows:
        return None
    return model.logits(hidden[: len(logit_rows)])
