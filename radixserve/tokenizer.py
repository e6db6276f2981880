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

Prompts given as segments, some of them marked as documents (issue 46: order-free reuse) are
tokenized here too (``split_segments``, ``encode_segments``), for the server and the Engine alike.
A segment is ``{"text": str, "document": bool}`` or ``{"input_ids": [int], "document": bool}``
(``document`` defaults to false).  ``encode_segments`` turns one prompt's segments into its token
ids and the ``(start, end)`` ranges of those ids that are documents (``doc_spans``: sorted,
non-overlapping, non-empty; each document its own span, adjacent ones too).  Only the documents
may be reused out of order by the scheduler; everything else keeps exact prefix semantics.
Each document is encoded on its own, without special tokens, so its ids are the document
text's own wherever it is placed.  Consecutive non-document text segments are joined and encoded
as one piece (as ``text`` would be); ``input_ids`` segments are taken as given.  The tokenizer's
special tokens (BOS, when it adds one) come once, at the very start (an EOS-like suffix at the
very end), never inside a document, when the prompt has a text segment -- a prompt made only of
``input_ids`` gets none, like ``input_ids``.  A prompt without any document is exactly ``text``
(the joined text, encoded as today) or ``input_ids`` (concatenated) for the same content, with
``doc_spans`` None.  Empty segments are skipped.  Errors are ValueError naming the field
(``segments.1.document: ...``).
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Optional

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


# ---------------------------------------------------------------- prompts as segments (documents)
Encode = Callable[[str], list[int]]
Spans = list[tuple[int, int]]
SEGMENT_KEYS = frozenset({"text", "input_ids", "document"})
_PROBE = "Hello"  # encoded with and without special tokens to find the tokenizer's own


@dataclass(frozen=True)
class Segment:
    """One checked segment: exactly one of ``text`` and ``input_ids``."""

    text: Optional[str] = None
    input_ids: Optional[tuple[int, ...]] = None
    document: bool = False


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def parse_segment(raw: Any, name: str) -> Segment:
    """A ``Segment`` from a mapping (or a ``Segment``); ValueError naming ``name`` or its key."""
    if isinstance(raw, Segment):
        return raw
    if not isinstance(raw, dict):
        raise ValueError(f'{name}: must be an object {{"text": ...}} or {{"input_ids": [...]}} with "document"')
    unknown = sorted(set(raw) - SEGMENT_KEYS, key=str)
    if unknown:
        # a client's key may hold anything: quoted where it is not a plain name (as validation.py names fields)
        key = str(unknown[0])
        key = key if re.fullmatch(r"[\w\-]+", key) else json.dumps(key).replace(" ", "\\u0020")
        raise ValueError(f"{name}.{key}: unknown segment key (known: document, input_ids, text)")
    text, ids, doc = raw.get("text"), raw.get("input_ids"), raw.get("document", False)
    if (text is None) == (ids is None):
        raise ValueError(f"{name}: give exactly one of text and input_ids")
    if text is not None and not isinstance(text, str):
        raise ValueError(f"{name}.text: must be a string")
    if ids is not None and not (isinstance(ids, (list, tuple)) and all(_is_int(t) for t in ids)):
        raise ValueError(f"{name}.input_ids: must be a list of ints")
    if not isinstance(doc, bool):
        raise ValueError(f"{name}.document: must be a boolean (got {doc!r})")
    return Segment(text, None if ids is None else tuple(ids), doc)


def is_batch(segments: Any) -> bool:
    """Whether ``segments`` is a batch (a list of segment lists) rather than one prompt's list."""
    return isinstance(segments, (list, tuple)) and bool(segments) and isinstance(segments[0], (list, tuple))


def parse_prompt(segments: Any, name: str) -> list[Segment]:
    """One prompt's checked segments; ValueError naming ``name`` (empty, not a list) or a segment."""
    if not isinstance(segments, (list, tuple)):
        raise ValueError(f"{name}: must be a list of segments or a list of such lists")
    if not segments:
        raise ValueError(f"{name}: the prompt has no segments")
    return [parse_segment(s, f"{name}.{i}") for i, s in enumerate(segments)]


def special_tokens(encode: Encode, encode_plain: Encode) -> tuple[list[int], list[int]]:
    """The ids ``encode`` puts before and after the text's own ones (``encode_plain``: without
    special tokens), e.g. ``([bos], [])``; ``([], [])`` when it adds none (or not around the text)."""
    full, bare = list(encode(_PROBE)), list(encode_plain(_PROBE))
    for k in range(len(full) - len(bare) + 1):
        if full[k:k + len(bare)] == bare:
            return full[:k], full[k + len(bare):]
    return [], []


def encode_segments(segments: list[Segment], encode: Encode, encode_plain: Encode) -> tuple[list[int], Optional[Spans]]:
    """A prompt's ids and document spans (None without documents); see the module docstring.
    ``encode`` adds the tokenizer's special tokens as ``text`` does, ``encode_plain`` adds none."""
    segs = [s for s in segments if (s.text if s.text is not None else s.input_ids)]
    has_text = any(s.text is not None for s in segs)
    if not any(s.document for s in segs):
        if all(s.text is not None for s in segs):
            return list(encode("".join(s.text for s in segs))), None  # exactly ``text``
    prefix, suffix = special_tokens(encode, encode_plain) if has_text else ([], [])
    ids: list[int] = list(prefix)
    spans: Spans = []
    pending: list[str] = []  # consecutive non-document text, encoded as one piece

    def flush() -> None:
        if pending:
            ids.extend(encode_plain("".join(pending)))
            pending.clear()

    for s in segs:
        if s.text is not None and not s.document:
            pending.append(s.text)
            continue
        flush()
        piece = list(s.input_ids) if s.input_ids is not None else list(encode_plain(s.text))
        if s.document and piece:
            spans.append((len(ids), len(ids) + len(piece)))
        ids.extend(piece)
    flush()
    ids.extend(suffix)
    return ids, spans or None


def split_segments(segments: Any, encode: Encode, encode_plain: Encode,
                   field: str = "segments") -> tuple[list[list[int]], list[Optional[Spans]], bool]:
    """A ``segments`` field (one prompt's list, or a list of them) as per-prompt ids, per-prompt
    document spans and whether it was a batch; ValueError naming the field."""
    batched = is_batch(segments)
    prompts = list(segments) if batched else [segments]
    ids_list, spans_list = [], []
    for i, prompt in enumerate(prompts):
        ids, spans = encode_segments(parse_prompt(prompt, f"{field}.{i}" if batched else field), encode, encode_plain)
        ids_list.append(ids)
        spans_list.append(spans)
    return ids_list, spans_list, batched


def check_spans(spans: Optional[Spans], length: int, name: str) -> None:
    """ValueError naming ``name`` unless ``spans`` (None: no documents) are sorted, non-overlapping,
    non-empty ``(start, end)`` ranges within a prompt of ``length`` tokens."""
    if spans is None:
        return
    prev = 0
    for s in spans:
        if not (isinstance(s, (list, tuple)) and len(s) == 2 and all(_is_int(x) for x in s)
                and prev <= s[0] < s[1] <= length):
            raise ValueError(f"{name}: document spans must be sorted, non-overlapping, non-empty ranges "
                             f"within the prompt (got {s!r})")
        prev = s[1]
