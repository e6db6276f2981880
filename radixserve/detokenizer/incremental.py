"""Incremental, UTF-8 safe detokenization.

Decoding each new token alone breaks multi-byte characters and SentencePiece spacing, so
the decoder re-decodes a short window (from ``prefix_offset``) and emits only the text
past what the window already produced, holding back text that ends in an incomplete
UTF-8 sequence (U+FFFD).  Work per token is O(window), not O(output).
"""
from __future__ import annotations

from typing import Any


class IncrementalDecoder:
    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True,
                 spaces_between_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0
        self.text = ""

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip)

    def add(self, new_ids: list[int]) -> str:
        """Append tokens; return the newly readable text (possibly empty)."""
        self.ids.extend(new_ids)
        prefix_text = self._decode(self.ids[self.prefix_offset: self.read_offset])
        full = self._decode(self.ids[self.prefix_offset:])
        if len(full) > len(prefix_text) and not full.endswith("\ufffd"):
            delta = full[len(prefix_text):]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            self.text += delta
            return delta
        return ""

    def finish(self) -> str:
        """Flush held-back bytes; returns the final text."""
        full = self._decode(self.ids)
        if full.startswith(self.text):
            self.text = full
        return self.text


def trim_stop(text: str, finish_reason: Any) -> str:
    """Cut the text before the stop string that ended the request."""
    if finish_reason and finish_reason.get("type") == "stop" and isinstance(finish_reason.get("matched"), str):
        cut = text.find(finish_reason["matched"])
        if cut >= 0:
            return text[:cut]
    return text
