"""Grammar backend: compiled-index cache (LRU) over the compile pool, and per-state masks.

Contract:
- ``GrammarBackend(tokenizer, vocab_size, eos_ids, cfg)`` (``cfg``: the ``SchedulerConfig``,
  whose ``grammar_*`` fields size the pool and the caches) builds the byte vocabulary once
  (a few hundred ms; the scheduler creates the backend lazily, on the first constrained
  request, so unconstrained serving never pays for it).
- ``request(constraint)`` starts (or joins) the compilation of ``constraint.key`` and never
  blocks; ``poll(constraint)`` then returns a ``CompiledGrammar``, a ``ValueError`` describing the
  failure (compile error or timeout), or None while compiling.  Results, failures
  included, are cached by key with an LRU bound of ``cache_size``.
- ``CompiledGrammar.info(state)`` gives ``(mask, forced, has_token)`` for an FSM state
  (``has_token``: some non-EOS token is allowed): ``mask`` is a
  shared ``bool[vocab_size]`` (callers must not modify it) of allowed tokens (EOS ids only in accepting states), built
  with vectorized numpy from the outlines-core bitmask; ``forced`` is the byte string every
  continuation from that state must start with (see jump_forward.py).  Both are cached per
  (grammar, state) in one LRU of ``mask_cache_size`` entries shared by all grammars.
"""
from __future__ import annotations

import itertools
import time
from collections import OrderedDict
from concurrent.futures import Future
from typing import Any, Optional, Union

import numpy as np

from radixserve.config import SchedulerConfig
from radixserve.constrained.compile_pool import CompilePool
from radixserve.constrained.jump_forward import forced_bytes
from radixserve.constrained.spec import Constraint
from radixserve.constrained.vocab import TokenVocab


class LRU(OrderedDict):
    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = max(1, int(capacity))

    def get_item(self, key: Any) -> Any:
        if key in self:
            self.move_to_end(key)
            return self[key]
        return None

    def put(self, key: Any, value: Any) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.capacity:
            self.popitem(last=False)


class CompiledGrammar:
    """An outlines-core ``Index`` plus what the scheduler needs per state."""

    _ids = itertools.count()

    def __init__(self, key: tuple, index: Any, backend: "GrammarBackend") -> None:
        self.key = key
        self.uid = next(self._ids)
        self.index = index
        self.backend = backend
        self.vocab: TokenVocab = backend.vocab
        self.initial = index.get_initial_state()
        self.finals = frozenset(index.get_final_states())
        self.words = (self.vocab.size + 31) // 32

    def next_state(self, state: int, token: int) -> Optional[int]:
        return self.index.get_next_state(state, token)

    def is_final(self, state: int) -> bool:
        return state in self.finals

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
        mask &= ~self.vocab.eos_mask
        if state in self.finals:
            mask |= self.vocab.eos_mask
        return mask


class GrammarBackend:
    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: tuple[int, ...], cfg: SchedulerConfig) -> None:
        t0 = time.perf_counter()
        self.vocab = TokenVocab.from_tokenizer(tokenizer, vocab_size, eos_ids)
        self.pool = CompilePool(self.vocab.outlines_vocabulary(), cfg.grammar_compile_workers,
                                cfg.grammar_compile_timeout, cfg.grammar_compile_memory_mb)
        self.setup_seconds = time.perf_counter() - t0
        self.cache: LRU = LRU(cfg.grammar_cache_size)
        self.state_cache: LRU = LRU(cfg.grammar_mask_cache_size)
        self.inflight: dict[tuple, Future] = {}
        self.mask_hits = 0
        self.mask_build_seconds: list[float] = []

    def request(self, c: Constraint) -> None:
        if self.cache.get_item(c.key) is None and c.key not in self.inflight:
            self.inflight[c.key] = self.pool.submit(c.regex)

    def poll(self, c: Constraint) -> Union["CompiledGrammar", ValueError, None]:
        key = c.key
        hit = self.cache.get_item(key)
        if hit is not None:
            return hit
        fut = self.inflight.get(key)
        if fut is None:  # evicted from the cache between request and poll: compile again
            self.request(c)
            return None
        if not fut.done():
            return None
        del self.inflight[key]
        err = fut.exception()
        if err is not None:
            out: Any = err if isinstance(err, ValueError) else ValueError(f"{type(err).__name__}: {err}")
        else:
            out = CompiledGrammar(key, fut.result(), self)
        self.cache.put(key, out)
        return out

    def pending_futures(self) -> list[Future]:
        return list(self.inflight.values())

    def close(self) -> None:
        self.pool.close()
