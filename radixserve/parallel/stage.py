"""Which layers a pipeline stage holds, and which checkpoint tensors it loads.

``PipeStage.of(index, count, num_layers)``: stage ``index`` of ``count`` holds a contiguous
run of layers, split as evenly as possible (the first stages take one more when they do not
divide: 30 layers on 4 stages give 8 + 8 + 7 + 7).  Stage 0 also holds the embedding, the
last stage the final norm and the LM head (and the embedding too when the head is tied to
it).  Layers keep their global ids (the KV pool, per-layer rotaries and sliding windows are
indexed by them); only their parameter names are renumbered from the stage's first layer,
because the model holds them in an ordinary ``nn.ModuleList``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from radixserve.parallel.layout import _even_split

_LAYER = re.compile(r"^layers\.(\d+)\.(.*)$")


@dataclass(frozen=True)
class PipeStage:
    """Stage ``index`` of ``count``: global layers ``[first, first + num_layers)``."""

    index: int
    count: int
    first: int
    num_layers: int

    @classmethod
    def of(cls, index: int, count: int, total_layers: int) -> "PipeStage":
        """The stage's layers; raises ValueError naming ``pp_size`` when some stage would get none."""
        if count > total_layers:
            raise ValueError(f"pp_size: {count} stages cannot split {total_layers} layers (at most one stage a layer)")
        first, n = _even_split(total_layers, count, index)
        return cls(index, count, first, n)

    @classmethod
    def whole(cls, total_layers: int) -> "PipeStage":
        """The whole model (no pipeline)."""
        return cls(0, 1, 0, total_layers)

    @property
    def layers(self) -> range:
        return range(self.first, self.first + self.num_layers)

    @property
    def is_first(self) -> bool:
        return self.index == 0

    @property
    def is_last(self) -> bool:
        return self.index == self.count - 1

    def holds_embedding(self, tied_head: bool) -> bool:
        return self.is_first or (self.is_last and tied_head)

    def param_name(self, name: str, tied_head: bool) -> Optional[str]:
        """The model parameter a checkpoint tensor (``name`` without ``model.``) loads into on this
        stage, or None when the stage does not hold it."""
        if self.count == 1:
            return name
        m = _LAYER.match(name)
        if m:
            i = int(m.group(1))
            return f"layers.{i - self.first}.{m.group(2)}" if i in self.layers else None
        if name.startswith("embed_tokens."):
            return name if self.holds_embedding(tied_head) else None
        if name.startswith("norm.") or name.startswith("lm_head."):
            return name if self.is_last else None
        return name
