"""Tokenizer loading, for every process and the Engine (one module: nothing else loads one).

``load_hf_tokenizer(path)`` is transformers' ``AutoTokenizer`` (the Engine, the model worker's
chat templates).  The scheduler, detokenizer and server processes use a lighter one that
avoids importing transformers (and torch) when that provably changes nothing; it keeps their
start-up short.

``load_light_tokenizer(path)`` returns a ``FastTokenizer`` over the Rust ``tokenizers``
library when the checkpoint's tokenizer is a plain ``tokenizer.json`` whose transformers
class adds no decode logic of its own (TokenizersBackend / PreTrainedTokenizerFast without
space clean-up); otherwise it returns transformers' ``AutoTokenizer``.  Both give the same
``encode(text) -> ids``, ``decode(ids, skip_special_tokens)`` and ``eos_token_id``; chat templates need
transformers (``load_hf_tokenizer``).
"""
from __future__ import annotations

import json
import os
from typing import Any, Optional

PLAIN_CLASSES = {"TokenizersBackend", "PreTrainedTokenizerFast"}


class FastTokenizer:
    def __init__(self, folder: str, config: dict) -> None:
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
        eos = config.get("eos_token")
        if isinstance(eos, dict):
            eos = eos.get("content")
        self.eos_token_id: Optional[int] = self._tok.token_to_id(eos) if isinstance(eos, str) else None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def __len__(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)


def load_light_tokenizer(path: str) -> Any:
    try:
        with open(os.path.join(path, "tokenizer_config.json")) as f:
            config = json.load(f)
    except (OSError, ValueError):
        config = None
    if (config is not None and os.path.isfile(os.path.join(path, "tokenizer.json"))
            and config.get("tokenizer_class") in PLAIN_CLASSES
            and not config.get("clean_up_tokenization_spaces", False)):
        return FastTokenizer(path, config)
    return load_hf_tokenizer(path)


def load_hf_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def eos_token_ids(tokenizer: Any, hf_dir: str) -> tuple[int, ...]:
    """EOS ids from generation_config.json when present, plus the tokenizer's EOS (read
    without importing transformers)."""
    ids: set[int] = set()
    try:
        with open(os.path.join(hf_dir, "generation_config.json")) as f:
            e = json.load(f).get("eos_token_id")
        ids.update([e] if isinstance(e, int) else (e or []))
    except (OSError, ValueError):
        pass
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return tuple(sorted(ids))
