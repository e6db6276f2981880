"""Grammar backends: the contract and the compiled-grammar cache both libraries share.

Contract:
- ``registry.make_backend(tokenizer, vocab_size, eos_ids, cfg)`` builds the backend named by
  ``cfg.grammar_backend`` ("outlines": outlines_backend.py, "llguidance": llg_backend.py),
  once: the scheduler's ``GrammarManager`` creates it lazily, on the first constrained
  request, so unconstrained serving never pays for the byte vocabulary (a few hundred ms).
- ``request(constraint)`` starts (or joins) the compilation of ``constraint.key`` and never
  blocks; ``poll(constraint)`` then returns a ``CompiledGrammar``, a ``ValueError`` describing
  the failure (compile error or timeout), or None while compiling.  Results, failures
  included, are cached by key with an LRU bound of ``cfg.grammar_cache_size``.
- ``CompiledGrammar.new_state()`` is a fresh ``GrammarState`` (fsm_state.py) for one request.
- A subclass provides ``_submit(source) -> Future`` (compile ``Constraint.source`` off the
  scheduler thread) and ``_wrap(key, result) -> CompiledGrammar``; ``compile_seconds`` lists
  the compile time of every finished compilation, ``mask_build_seconds`` / ``mask_hits`` the
  mask builds and cache hits (benchmarks read them).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from concurrent.futures import Future
from typing import Any, Union

from radixserve.config import SchedulerConfig
from radixserve.constrained.runtime.fsm_state import GrammarState
from radixserve.constrained.schema.spec import Constraint
from radixserve.constrained.runtime.vocab import TokenVocab


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


class CompiledGrammar(ABC):
    key: tuple

    @abstractmethod
    def new_state(self) -> GrammarState: ...


class GrammarBackend(ABC):
    name = ""

    def __init__(self, vocab: TokenVocab, cfg: SchedulerConfig) -> None:
        self.vocab = vocab
        self.cfg = cfg
        self.cache: LRU = LRU(cfg.grammar_cache_size)
        self.inflight: dict[tuple, Future] = {}
        self.compile_seconds: list[float] = []
        self.mask_hits = 0
        self.mask_build_seconds: list[float] = []
        self.setup_seconds = 0.0

    @abstractmethod
    def _submit(self, source: str) -> Future: ...

    @abstractmethod
    def _wrap(self, key: tuple, result: Any) -> CompiledGrammar: ...

    def close(self) -> None:
        pass

    def request(self, c: Constraint) -> None:
        if self.cache.get_item(c.key) is None and c.key not in self.inflight:
            self.inflight[c.key] = self._submit(c.source)

    def poll(self, c: Constraint) -> Union[CompiledGrammar, ValueError, None]:
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
            out = self._wrap(key, fut.result())
        self.cache.put(key, out)
        return out

    def pending_futures(self) -> list[Future]:
        return list(self.inflight.values())

