"""Loading Hugging Face-named checkpoint tensors into a ``DecoderLM``.

q/k/v and gate/up projections are fused into one matrix each (``qkv_proj``, ``gate_up_proj``);
each tensor is first passed through the model's ``checkpoint_tensors`` hook (an architecture
renames, splits or shifts tensors there: Phi-3's fused projections are split so that tensor
parallelism slices them like Llama's; Gemma's ``1 + w`` norms are shifted), then sliced to the
rank's part by the ``TPLayout``.
"""
from __future__ import annotations

from typing import Iterable, Iterator

import torch
from torch import nn

FUSED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
         "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}
PARTS = {"qkv_proj": 3, "gate_up_proj": 2}


class WeightLoaderMixin:
    """``load_weights`` for a model with ``layout``, ``stage`` (``parallel.stage.PipeStage``: the
    tensors of layers it does not hold are skipped, its layers' renumbered) and ``tie_word_embeddings``."""

    def checkpoint_tensors(self, name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        """The model's tensors for one checkpoint tensor (``name`` without ``model.``); none to skip it."""
        yield name, tensor

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load Hugging Face-named tensors (this rank's slice of each), fusing q/k/v and gate/up
        projections; raises ValueError for a missing, unexpected or misshapen weight."""
        params = dict(self.named_parameters())
        pending: dict[str, dict[int, torch.Tensor]] = {}
        loaded: set[str] = set()
        for raw_name, raw in weights:
            raw_name = raw_name.removeprefix("model.")
            if "rotary_emb" in raw_name or (raw_name == "lm_head.weight" and self.tie_word_embeddings):
                continue
            for name, tensor in self.checkpoint_tensors(raw_name, raw):
                name = self.stage.param_name(name, self.tie_word_embeddings)
                if name is None:  # another pipeline stage's
                    continue
                tensor = self.layout.shard(name, tensor)
                part = next(((short, *FUSED[short]) for short in FUSED if f".{short}." in name), None)
                if part is None:
                    self._copy(params, name, tensor)
                    loaded.add(name)
                    continue
                short, target, idx = part
                fused_name = name.replace(short, target)
                group = pending.setdefault(fused_name, {})
                group[idx] = tensor
                if len(group) == PARTS[target]:
                    self._copy(params, fused_name, torch.cat([group[i] for i in range(len(group))], dim=0))
                    loaded.add(fused_name)
                    del pending[fused_name]
        missing = set(params) - loaded
        if missing or pending:
            raise ValueError(f"checkpoint is missing weights: {sorted(missing | set(pending))[:8]}")

    @staticmethod
    def _copy(params: dict[str, nn.Parameter], name: str, tensor: torch.Tensor) -> None:
        if name not in params:
            raise ValueError(f"unexpected weight {name!r} in checkpoint")
        p = params[name]
        if p.shape != tensor.shape:
            raise ValueError(f"weight {name}: checkpoint shape {tuple(tensor.shape)} != model {tuple(p.shape)}")
        with torch.no_grad():
            p.copy_(tensor.to(p.dtype))
