"""llguidance backend: grammars compiled in threads into ``LLMatcher`` templates.

Contract (beyond backend.py's):
- ``LLGuidanceBackend(tokenizer, vocab_size, eos_ids, cfg)`` builds the byte vocabulary and
  llguidance's ``LLTokenizer`` (its token trie) once, from the same ``tokenizers`` JSON the
  model uses (special tokens, EOS ids and the padded ``vocab_size`` included).
- ``Constraint.source`` (a llguidance grammar, llg_spec.py) compiles in one of
  ``grammar_compile_workers`` threads: ``LLMatcher`` releases the GIL while it builds and its
  parser limits (``LLParserLimits`` defaults: lexer fuel, Earley items per step, grammar
  size) bound the work, so a compile never runs away; it takes about a millisecond, and
  the lexer is built lazily as tokens arrive.  A grammar that fails with a tokenizer
  attached (e.g. a limit) fails the request with llguidance's message.
- ``LLGuidanceGrammar.new_state()`` deep-copies the compiled matcher (cheap) into one
  request's ``LLGuidanceState`` (llg_state.py).
"""
from __future__ import annotations

import copy
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from radixserve.config import SchedulerConfig
from radixserve.constrained.runtime.backend import CompiledGrammar, GrammarBackend
from radixserve.constrained.runtime.fsm_state import GrammarState
from radixserve.constrained.runtime.vocab import TokenVocab, find_backend


def ll_tokenizer(tokenizer: Any, vocab: TokenVocab, vocab_size: int, eos_ids: tuple[int, ...]) -> Any:
    from llguidance import LLTokenizer, TokenizerWrapper

    eos = list(eos_ids) or None
    backend = find_backend(tokenizer)
    if backend is not None and hasattr(backend, "to_str"):
        tk = copy.copy(backend)
        tk.no_padding()
        tk.no_truncation()
        return LLTokenizer(tk.to_str(), n_vocab=vocab_size, eos_token=eos)
    return LLTokenizer(TokenizerWrapper(_BytesTokenizer(vocab, eos_ids)), n_vocab=vocab_size, eos_token=eos)


class _BytesTokenizer:
    """The minimal tokenizer ``llguidance.TokenizerWrapper`` reads, from the byte vocabulary
    (for tokenizers without a ``tokenizers`` JSON)."""

    def __init__(self, vocab: TokenVocab, eos_ids: tuple[int, ...]) -> None:
        self.eos_token_id = eos_ids[0] if eos_ids else vocab.size - 1
        self.bos_token_id = None
        self.special_token_ids = [i for i, b in enumerate(vocab.token_bytes) if b is None]
        self.tokens = [b if b is not None else f"<special_{i}>".encode() for i, b in enumerate(vocab.token_bytes)]
        self._vocab = vocab

    def __call__(self, s: Any) -> list[int]:
        return self._vocab.encode(s.decode("utf-8", "replace") if isinstance(s, bytes) else s)


class LLGuidanceGrammar(CompiledGrammar):
    def __init__(self, key: tuple, matcher: Any, backend: "LLGuidanceBackend") -> None:
        self.key = key
        self.matcher = matcher  # never advanced: every request gets a deep copy
        self.backend = backend
        self.vocab = backend.vocab

    def new_state(self) -> GrammarState:
        from radixserve.constrained.runtime.llg_state import LLGuidanceState

        return LLGuidanceState(self.matcher.deep_copy(), self.backend)


class LLGuidanceBackend(GrammarBackend):
    name = "llguidance"

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: tuple[int, ...], cfg: SchedulerConfig) -> None:
        t0 = time.perf_counter()
        super().__init__(TokenVocab.from_tokenizer(tokenizer, vocab_size, eos_ids), cfg)
        self.tokenizer = ll_tokenizer(tokenizer, self.vocab, vocab_size, tuple(eos_ids))
        self.pool = ThreadPoolExecutor(max(1, cfg.grammar_compile_workers), thread_name_prefix="llg-compile")
        self.setup_seconds = time.perf_counter() - t0

    def compile(self, source: str) -> Any:
        """A compiled ``LLMatcher`` (at its start state), or ValueError with llguidance's message."""
        from llguidance import LLMatcher

        t0 = time.perf_counter()
        m = LLMatcher(self.tokenizer, source, log_level=0)
        self.compile_seconds.append(time.perf_counter() - t0)
        if m.is_error():
            raise ValueError(m.get_error().strip())
        return m

    def _submit(self, source: str) -> Future:
        return self.pool.submit(self.compile, source)

    def _wrap(self, key: tuple, result: Any) -> CompiledGrammar:
        return LLGuidanceGrammar(key, result, self)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
