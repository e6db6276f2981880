"""The vocab-parallel embedding of a tensor-parallel rank (``parallel/layout.py``).

Contract: ``VocabParallelEmbedding(layout, hidden, tp)(ids)`` equals the full embedding's
lookup on every rank: each rank looks up the ids of its vocabulary shard (zeros elsewhere)
and the shards are summed with one all-reduce (exact: one rank contributes each row).
The parameter is named ``weight`` like ``nn.Embedding``'s, so checkpoints and the tied LM
head read it the same way.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from radixserve.parallel.layout import TPLayout


class VocabParallelEmbedding(nn.Module):
    def __init__(self, layout: TPLayout, hidden: int, tp: Any) -> None:
        super().__init__()
        self.start, self.shard = layout.vocab_start, layout.vocab_shard
        self.tp = tp
        self.weight = nn.Parameter(torch.empty(layout.vocab_shard, hidden))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.start
        outside = (local < 0) | (local >= self.shard)
        x = F.embedding(local.masked_fill(outside, 0), self.weight)
        x.masked_fill_(outside.unsqueeze(-1), 0)
        return self.tp.all_reduce(x)
