"""The LM head of a ``DecoderLM``: tied or own weights, the quantized and packed variants, and
final logit soft-capping (Gemma 2)."""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn


class LMHeadMixin:
    """Gives a model ``lm_head`` (unless tied to ``embed_tokens``), ``lm_head_weight`` and
    ``logits``.  The model sets ``tp``, ``layout``, ``config`` and ``final_logit_softcap``."""

    def init_lm_head(self, config: Any, held: bool = True) -> None:
        """``held`` False: a pipeline stage without the head (``lm_head_weight`` is then None)."""
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self.has_lm_head = held
        if held and not self.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, self.layout.vocab_shard, bias=False)
        # a quantized LM head for calls of at most lm_head_max_m rows (model/quant/linear.py)
        self.lm_head_quant: Optional[nn.Module] = None
        self.lm_head_max_m: Optional[int] = None
        self.lm_head_packed: Optional[nn.Module] = None  # the dense head on packed weights (quant/packed.py)

    def lm_head_weight(self) -> Optional[torch.Tensor]:
        if not self.has_lm_head:
            return None
        return self.embed_tokens.weight if self.tie_word_embeddings else self.lm_head.weight

    @torch.inference_mode()
    def logits(self, x: torch.Tensor) -> Optional[torch.Tensor]:
        """fp32 logits of final hidden states ``x`` (fp32 or the model's dtype; under TP: on rank
        0; None on the others).  The quantized head reads fp32 x as it is; a dense one in its dtype."""
        if self.lm_head_quant is not None and (self.lm_head_max_m is None or x.shape[0] <= self.lm_head_max_m):
            out = self.lm_head_quant(x).float()
        elif self.lm_head_packed is not None:
            out = self.lm_head_packed(x.to(self.lm_head_packed.weight_dtype)).float()
        else:
            w = self.lm_head_weight()
            out = self.tp.gather_vocab(F.linear(x.to(w.dtype), w).float(), self.config.vocab_size)
        cap = self.final_logit_softcap
        if cap is not None and out is not None:
            out = torch.tanh(out / cap) * cap
        return out
