"""The grammar backend named by the configuration, built once (see backend.py for the contract)."""
from __future__ import annotations

from typing import Any

from radixserve.config import SchedulerConfig
from radixserve.constrained.runtime.backend import GrammarBackend


def make_backend(tokenizer: Any, vocab_size: int, eos_ids: tuple[int, ...], cfg: SchedulerConfig) -> GrammarBackend:
    """``cfg.grammar_backend``: "outlines" (outlines_backend.py) or "llguidance" (llg_backend.py)."""
    if cfg.grammar_backend == "outlines":
        from radixserve.constrained.runtime.outlines_backend import OutlinesBackend

        return OutlinesBackend(tokenizer, vocab_size, eos_ids, cfg)
    from radixserve.constrained.runtime.llg_backend import LLGuidanceBackend

    return LLGuidanceBackend(tokenizer, vocab_size, eos_ids, cfg)
