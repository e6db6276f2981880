"""The model's vocabulary as byte strings, for outlines-core and for jump-forward.

Contract:
- ``TokenVocab.from_tokenizer(tok, vocab_size, eos_ids)`` works with a transformers
  tokenizer (``backend_tokenizer``), radixserve's ``FastTokenizer`` (``_tok``) or a bare
  ``tokenizers.Tokenizer``; nothing is downloaded.
- ``token_bytes[i]`` is the exact byte string token ``i`` contributes to the decoded text:
  byte-level BPE tokens (GPT-2 / SmolLM2) go through the GPT-2 byte decoder, SentencePiece
  tokens map ``▁`` to a space and ``<0xNN>`` to the byte; special (added, ``special=True``)
  tokens and ids past the tokenizer (padding rows of the embedding) are ``None`` and never
  allowed by a grammar.  EOS is handled by the FSM (allowed only in accepting states).
- ``outlines_vocabulary()`` builds the ``outlines_core.Vocabulary(eos, {bytes: [ids]})``.
- ``encode(text)`` tokenizes without special tokens (used to re-tokenize jump-forward text).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Optional

import numpy as np


@lru_cache(maxsize=1)
def gpt2_byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's ``bytes_to_unicode``: printable stand-in character -> byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def find_backend(tokenizer: Any) -> Optional[Any]:
    """The ``tokenizers.Tokenizer`` behind a tokenizer object, if there is one."""
    for cand in (tokenizer, getattr(tokenizer, "backend_tokenizer", None), getattr(tokenizer, "_tok", None)):
        if cand is not None and hasattr(cand, "get_added_tokens_decoder") and hasattr(cand, "get_vocab"):
            return cand
    return None


def _decoder_kinds(backend: Any) -> set[str]:
    dec = getattr(backend, "decoder", None)
    if dec is None:
        return set()
    kinds = {type(dec).__name__}
    try:  # a Sequence decoder: look at its parts
        import json

        d = json.loads(backend.to_str()).get("decoder") or {}
        kinds |= {x.get("type", "") for x in d.get("decoders", [])}
        kinds.add(d.get("type", ""))
    except Exception:  # noqa: BLE001 - best effort; the vocab heuristics below still apply
        pass
    return kinds


class TokenVocab:
    def __init__(self, token_bytes: list[Optional[bytes]], eos_ids: tuple[int, ...], encoder: Any) -> None:
        self.token_bytes = token_bytes
        self.size = len(token_bytes)
        self.eos_ids = tuple(eos_ids)
        self._encoder = encoder
        self.eos_mask = np.zeros(self.size, dtype=bool)
        for e in self.eos_ids:
            if 0 <= e < self.size:
                self.eos_mask[e] = True
        # first byte of every token, -1 for special/empty tokens (vectorized forced-byte checks)
        self.first_byte = np.array([b[0] if b else -1 for b in token_bytes], dtype=np.int16)

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, vocab_size: int, eos_ids: tuple[int, ...]) -> "TokenVocab":
        backend = find_backend(tokenizer)
        if backend is not None:
            vocab = backend.get_vocab(with_added_tokens=True)
            special = {i for i, t in backend.get_added_tokens_decoder().items() if t.special}
            kinds = _decoder_kinds(backend)
        else:
            vocab = tokenizer.get_vocab()
            special = set(getattr(tokenizer, "all_special_ids", []) or [])
            kinds = set()
        special |= set(eos_ids)
        byte_level = "ByteLevel" in kinds or (not kinds and sum(k.startswith("Ġ") for k in vocab) > 100)
        spm = not byte_level and ("Metaspace" in kinds or "ByteFallback" in kinds or "Replace" in kinds
                                  or sum(k.startswith("▁") for k in vocab) > 100)
        out: list[Optional[bytes]] = [None] * vocab_size
        if byte_level:
            table = {ord(c): chr(b) for c, b in gpt2_byte_decoder().items()}
        for s, i in vocab.items():
            if i in special or not 0 <= i < vocab_size:
                continue
            if byte_level:
                t = s.translate(table)
                if any(ord(ch) > 255 for ch in t):  # an added non-special token written in plain text
                    out[i] = s.encode("utf-8")
                else:
                    out[i] = t.encode("latin-1")
            elif spm:
                if len(s) == 6 and s.startswith("<0x") and s.endswith(">"):
                    out[i] = bytes([int(s[3:5], 16)])
                else:
                    out[i] = s.replace("▁", " ").encode("utf-8")
            else:
                out[i] = s.encode("utf-8")
        for i, b in enumerate(out):
            if b == b"":
                out[i] = None
        return cls(out, eos_ids, backend if backend is not None else tokenizer)

    def outlines_map(self) -> dict[bytes, list[int]]:
        m: dict[bytes, list[int]] = {}
        for i, b in enumerate(self.token_bytes):
            if b is not None:
                m.setdefault(b, []).append(i)
        return m

    def outlines_vocabulary(self) -> Any:
        from outlines_core import Vocabulary

        return Vocabulary(self.eos_ids[0] if self.eos_ids else self.size, self.outlines_map())

    def encode(self, text: str) -> list[int]:
        enc = self._encoder
        if find_backend(enc) is enc:
            return list(enc.encode(text, add_special_tokens=False).ids)
        try:
            return list(enc.encode(text, add_special_tokens=False))
        except TypeError:
            return list(enc.encode(text))

    def text_bytes(self, ids: list[int]) -> Optional[bytes]:
        """Concatenated bytes of ``ids``; None when one of them is special."""
        parts = [self.token_bytes[i] if 0 <= i < self.size else None for i in ids]
        if any(p is None for p in parts):
            return None
        return b"".join(parts)
