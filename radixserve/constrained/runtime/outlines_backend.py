"""outlines-core backend: indexes compiled in child processes, masks cached per state.

Contract (beyond backend.py's):
- ``OutlinesBackend(tokenizer, vocab_size, eos_ids, cfg)`` compiles ``Constraint.source`` (a
  regex) into an ``outlines_core.Index`` in the compile pool (``grammar_compile_workers``
  processes, each job limited to ``grammar_compile_timeout`` s and
  ``grammar_compile_memory_mb``).
- ``OutlinesGrammar.info(state)`` gives ``(mask, forced, has_token)`` for an index state
  (``has_token``: some non-EOS token is allowed): ``mask`` is a shared ``bool[vocab_size]``
  (callers must not modify it) of allowed tokens (EOS ids only in accepting states), built
  with vectorized numpy from the outlines-core bitmask; ``forced`` is the byte string every
  continuation from that state must start with (jump_forward.forced_bytes).  Both are
  cached per (grammar, state) in one LRU of ``grammar_mask_cache_size`` entries shared by
  all grammars: index states repeat across requests and positions, so most steps hit it.
"""
from __future__ import annotations

import itertools
import time
from concurrent.futures import Future
from typing import Any, Optional

import numpy as np

from radixserve.config import SchedulerConfig
from radixserve.constrained.runtime.backend import LRU, CompiledGrammar, GrammarBackend
from radixserve.constrained.runtime.compile_pool import CompilePool
from radixserve.constrained.runtime.fsm_state import GrammarState, finish_mask
from radixserve.constrained.runtime.jump_forward import forced_bytes
from radixserve.constrained.runtime.vocab import TokenVocab


class OutlinesGrammar(CompiledGrammar):
    """An outlines-core ``Index`` plus what the scheduler needs per state."""

    _ids = itertools.count()

    def __init__(self, key: tuple, index: Any, backend: "OutlinesBackend") -> None:
        self.key = key
        self.uid = next(self._ids)
        self.index = index
        self.backend = backend
        self.vocab: TokenVocab = backend.vocab
        self.initial = index.get_initial_state()
        self.finals = frozenset(index.get_final_states())
        self.words = (self.vocab.size + 31) // 32

    def new_state(self) -> GrammarState:
        from radixserve.constrained.runtime.outlines_state import OutlinesState

        return OutlinesState(self)

    def next_state(self, state: int, token: int) -> Optional[int]:
        return self.index.get_next_state(state, token)

    def is_final(self, state: int) -> bool:
        return state in self.finals

    def allowed_ids(self, state: int) -> np.ndarray:
        """Allowed non-EOS token ids at ``state`` (no caching: the forced-text walk)."""
        ids = np.asarray(self.index.get_allowed_tokens(state), dtype=np.int64)
        ids = ids[ids < self.vocab.size]
        return ids[~self.vocab.eos_mask[ids]]

    def info(self, state: int, guide: Any = None) -> tuple[np.ndarray, bytes, bool]:
        cache = self.backend.state_cache
        hit = cache.get_item((self.uid, state))
        if hit is not None:
            self.backend.mask_hits += 1
            return hit
        t0 = time.perf_counter()
        mask = self._mask(state, guide)
        allowed = np.flatnonzero(mask & ~self.vocab.eos_mask)
        forced = b"" if state in self.finals else forced_bytes(self, state, allowed)
        out = (mask, forced, bool(allowed.size))
        cache.put((self.uid, state), out)
        self.backend.mask_build_seconds.append(time.perf_counter() - t0)
        return out

    def _mask(self, state: int, guide: Any) -> np.ndarray:
        V = self.vocab.size
        if guide is not None and guide.get_state() == state:
            buf = np.zeros(self.words, dtype=np.int32)
            guide.write_mask_into(buf.ctypes.data, buf.size, 4)
            mask = np.unpackbits(buf.view(np.uint8), bitorder="little")[:V].astype(bool)
        else:
            mask = np.zeros(V, dtype=bool)
            ids = np.asarray(self.index.get_allowed_tokens(state), dtype=np.int64)
            mask[ids[ids < V]] = True
        return finish_mask(mask, self.vocab, state in self.finals)


class OutlinesBackend(GrammarBackend):
    name = "outlines"

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: tuple[int, ...], cfg: SchedulerConfig) -> None:
        t0 = time.perf_counter()
        super().__init__(TokenVocab.from_tokenizer(tokenizer, vocab_size, eos_ids), cfg)
        self.pool = CompilePool(self.vocab.outlines_vocabulary(), cfg.grammar_compile_workers,
                                cfg.grammar_compile_timeout, cfg.grammar_compile_memory_mb)
        self.compile_seconds = self.pool.compile_seconds
        self.setup_seconds = time.perf_counter() - t0
        self.state_cache: LRU = LRU(cfg.grammar_mask_cache_size)

    def _submit(self, source: str) -> Future:
        return self.pool.submit(source)

    def _wrap(self, key: tuple, result: Any) -> CompiledGrammar:
        return OutlinesGrammar(key, result, self)

    def close(self) -> None:
        self.pool.close()
