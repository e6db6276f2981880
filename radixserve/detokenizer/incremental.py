"""Incremental, UTF-8 safe detokenization.

Decoding each new token alone breaks multi-byte characters and SentencePiece spacing, so
the decoder re-decodes a short window (from ``prefix_offset``) and emits only the text
past what the window already produced, holding back text that ends in an incomplete
UTF-8 sequence (U+FFFD).  Work per token is O(window), not O(output).

``spaces_between_special_tokens`` is accepted and has no effect: it only changes the output
of transformers' slow (pure Python) tokenizers, which put a space between special tokens
and the text around them when ``skip_special_tokens`` is False.  radixserve decodes with
the Rust ``tokenizers`` library (or a fast transformers tokenizer), whose decode has no
such option and joins special tokens as the tokenizer's own decoder says; SGLang with a
fast tokenizer behaves the same way.

``trim_stop`` and ``safe_text_len`` are the stop-string / ``stop_regex`` rules of the
output text, shared by the detokenizer process and the in-process Engine.
"""
from __future__ import annotations

from typing import Any, Sequence

from radixserve.sampling_params import search_stop_regex


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


def trim_stop(text: str, finish_reason: Any, stop_regex: Sequence[str] = (), no_stop_trim: bool = False) -> str:
    """Cut the text before the stop string (or, when the matched pattern is one of
    ``stop_regex``, before the first match of that regex) that ended the request; nothing
    is cut with ``no_stop_trim``."""
    if no_stop_trim or not finish_reason or finish_reason.get("type") != "stop":
        return text
    matched = finish_reason.get("matched")
    if not isinstance(matched, str):
        return text
    cut = text.find(matched)
    if cut < 0 and matched in stop_regex:
        try:
            m = search_stop_regex(matched, text)
        except TimeoutError:
            m = None
        cut = m.start() if m else -1
    return text[:cut] if cut >= 0 else text


def safe_text_len(text: str, stops: Sequence[str], stop_regex: Sequence[str] = (), start: int = 0) -> int:
    """Length of the prefix of ``text`` that a stream can show before the request finished:
    it ends before any complete stop string or regex match, and before a suffix that could
    still grow into one (a stop-string prefix; a partial regex match).  ``start`` is what
    was already shown: no match begins before it, so regexes are searched from there."""
    end = len(text)
    for s in stops:
        cut = text.find(s)
        if cut >= 0:
            end = min(end, cut)
        # the longest proper prefix of s that text ends with: try only where s[0] occurs
        i = text.find(s[0], max(0, len(text) - len(s) + 1))
        while i >= 0:
            if s.startswith(text[i:]):
                end = min(end, i)
                break
            i = text.find(s[0], i + 1)
    for p in stop_regex:
        try:
            m = search_stop_regex(p, text, pos=min(start, end), partial=True)
        except TimeoutError:  # the scheduler aborts the request; show nothing more meanwhile
            end = min(end, start)
            continue
        if m is not None:
            end = min(end, m.start())
    return end
