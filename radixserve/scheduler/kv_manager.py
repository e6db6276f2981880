"""Moves KV slots between the allocator, the prefix cache and running requests.

Every slot is in exactly one of three states: free in the allocator, owned by one cache
node, or held by one running request (``row[cached_len:kv_len]``, plus the slots allocated
for the step being planned, ``row[kv_len:kv_len + n]``).

Contract: the ``KVManager`` is the only writer of the request-to-token table, the allocator
and the prefix cache behind it, and of a request's ``row``, ``cached_len`` and ``last_node``
(``kv_len`` is set at admission; the caller advances it after each step).  It is
single-threaded: the scheduler thread only.  Every prefix look-up and insertion uses the
request's ``cache_salt`` (its cache namespace).
A request holds a row from ``admit`` until ``release``; slots allocated past ``kv_len``
(``admit``, ``alloc_extend``, ``alloc_decode``) become computed when the caller advances
``kv_len`` after the step, or go back with ``free_tail`` when the step does not run (and
with ``discard_rejected`` when a speculative step computed tokens that were not kept).

With a sliding-window pool (``swa``: the model has sliding-window layers, see
``mem_cache/swa_slots.py``) every slot also has a sliding slot while its sliding layers' KV is
kept: allocation takes both, and when the sliding pool is short the sliding KV no running
request's window reads is freed (``mem_cache/swa_reclaim.py``); a cached prefix is used only
up to where its last ``window`` tokens keep their sliding KV.
"""
from __future__ import annotations

from typing import Any, Iterable, NamedTuple, Optional, Sequence

import numpy as np

from radixserve.mem_cache.allocator import SlotAllocator
from radixserve.mem_cache.continuation import continuation
from radixserve.mem_cache.hiradix_cache import HiRadixCache, TierSpec
from radixserve.mem_cache.invariants import check_memory_invariants
from radixserve.mem_cache.no_prefix_cache import NoPrefixCache
from radixserve.mem_cache.prefix_cache import PrefixCache
from radixserve.mem_cache.radix_cache import RadixCache
from radixserve.mem_cache.req_to_token import ReqToTokenPool
from radixserve.mem_cache.swa_reclaim import Window, reclaim_sliding, reclaimable, transfer_sliding
from radixserve.mem_cache.swa_slots import SwaSlotAllocator, usable_prefix
from radixserve.mem_cache.tree_node import TreeNode
from radixserve.scheduler.documents import clear_placement, place
from radixserve.scheduler.kv_views import KVViews
from radixserve.scheduler.req import Req


class PrefixMatch(NamedTuple):
    """A cached prefix, locked (``match_and_lock``) until ``admit`` or ``unlock``."""

    slots: np.ndarray
    node: TreeNode

    @property
    def length(self) -> int:
        return len(self.slots)


class KVManager(KVViews):
    def __init__(self, num_slots: int, max_rows: int, max_context_len: int, disable_radix_cache: bool = False,
                 swa: Optional[tuple[int, int]] = None, tiers: Optional[TierSpec] = None) -> None:
        """The prefix cache is chosen here, once: a ``RadixCache``, a ``NoPrefixCache`` with
        ``disable_radix_cache``, or a ``HiRadixCache`` with ``tiers`` (the hierarchical cache).
        ``swa``: (sliding slots, window) of a sliding-window pool."""
        allocator = SlotAllocator(num_slots) if swa is None else SwaSlotAllocator(num_slots, *swa)
        if disable_radix_cache:
            cache: PrefixCache = NoPrefixCache(allocator.free)
        elif tiers is not None and swa is None:
            cache = HiRadixCache(allocator, tiers.link, tiers.host_slots, tiers.disk_bytes, tiers.bytes_per_token,
                                 tiers.write_through)
        else:
            cache = RadixCache(allocator.free)
        self._attach(allocator, cache, ReqToTokenPool(max_rows, max_context_len))

    @classmethod
    def from_parts(cls, allocator: SlotAllocator, cache: PrefixCache, rows: ReqToTokenPool) -> "KVManager":
        """A manager over given parts (tests inspect them; nothing else may touch them)."""
        kv = cls.__new__(cls)
        kv._attach(allocator, cache, rows)
        return kv

    def _attach(self, allocator: SlotAllocator, cache: PrefixCache, rows: ReqToTokenPool) -> None:
        self._allocator, self._cache, self._rows = allocator, cache, rows
        self._live: dict[int, Req] = {}  # row -> the request holding it
        self._swa = allocator if isinstance(allocator, SwaSlotAllocator) else None
        self._admitting: Optional[Window] = None  # a locked match not yet admitted (its window counts)
        if self._swa is not None:
            swa = self._swa
            cache.on_duplicates = lambda tree, dup: transfer_sliding(swa, tree, dup)

    # ------------------------------------------------------------------ queries
    @property
    def capacity(self) -> int:
        return self._allocator.num_slots - 1

    def available(self) -> int:
        """Slots obtainable now: free ones plus unlocked cached ones."""
        return self._allocator.available_size() + self._cache.evictable_size

    def sliding_fits(self, n: int) -> bool:
        """Whether ``n`` new tokens get sliding slots now (free, or reclaimed from tokens no
        window reads); always True without a sliding pool.  Only the next chunk counts: a
        request's later tokens reuse the sliding slots its window leaves behind."""
        swa = self._swa
        return swa is None or n <= swa.sliding_available() or n <= swa.sliding_available() + self._reclaimable()

    def _windows(self) -> list[Window]:
        """What every running request (and a match being admitted) reads of the sliding pool."""
        table = self._rows.table
        out = [Window(table[r], req.cached_len, req.kv_len, req.last_node) for r, req in self._live.items()]
        return out + ([self._admitting] if self._admitting is not None else [])

    def _reclaimable(self) -> int:
        """How many sliding slots could be reclaimed now (counted, nothing freed)."""
        return reclaimable(self._swa, self._cache, self._windows())

    def free_slots(self) -> int:
        """Slots free in the allocator (without evicting)."""
        return self._allocator.available_size()

    def row(self, req: Req) -> np.ndarray:
        """The request's row of slots (int32).  Read-only for the caller."""
        return self._rows.table[req.row]

    def prefetch(self, req: Req) -> None:
        """A request joins the queue: the hierarchical cache starts reading the disk blocks of its
        match on the worker's reader thread (nothing else does anything)."""
        if self._cache.tiered:  # (no copy of the prompt for the caches without tiers)
            self._cache.prefetch(req.fill_ids[: req.prefix_match_limit()], req.cache_salt)

    def match_len(self, req: Req) -> int:
        """How many leading tokens of ``req`` are cached (refreshes their LRU stamps; may
        split a node).  Locks nothing."""
        return len(self._match(req)[0])

    def _match(self, req: Req) -> tuple[np.ndarray, TreeNode]:
        """The cached prefix ``req`` may use (cut where a sliding layer would miss keys)."""
        key = req.fill_ids[: req.prefix_match_limit()]
        slots, node = self._cache.match_prefix(key, req.cache_salt)
        if self._swa is not None and len(slots):
            m = usable_prefix(self._swa.swa_of, slots, self._swa.window)
            if m < len(slots):
                slots, node = self._cache.match_prefix(key[:m], req.cache_salt)
        return slots, node

    # ------------------------------------------------------------------ admission
    def match_and_lock(self, req: Req) -> PrefixMatch:
        """The cached prefix ``req`` may use, locked so that it cannot be evicted: the caller
        either ``admit``s the request with it or ``unlock``s it.  With the hierarchical cache the
        part of the match in a lower tier is loaded into the pool first."""
        if self._cache.tiered:
            self._cache.fetch(req.fill_ids[: req.prefix_match_limit()], req.cache_salt)
        slots, node = self._match(req)
        self._cache.inc_lock_ref(node)
        self._admitting = Window(slots, len(slots), len(slots), node)
        return PrefixMatch(slots, node)

    def unlock(self, match: PrefixMatch) -> None:
        self._cache.dec_lock_ref(match.node)
        self._admitting = None

    def record_hit(self, matched: int, total: int, node: Optional[TreeNode] = None) -> None:
        """Count a first admission in the cache's hit rate (and, with the ``node`` where its
        match ended, in the hit count of every node on that path)."""
        self._cache.record_hit(matched, total, node)

    def admit(self, req: Req, match: PrefixMatch, n: int) -> bool:
        """Give ``req`` a row holding the locked ``match`` followed by ``n`` new slots for its
        next ``n`` tokens (evicting unlocked cache entries when short).  False when the slots
        cannot be obtained: nothing is taken and the caller still holds the lock.  Raises
        when no row is free (the caller bounds the running requests)."""
        slots = self._alloc(n)
        if slots is None:
            return False
        self._admitting = None
        row = self._rows.alloc()
        assert row is not None, "request rows exhausted (max_running_requests)"
        req.row, req.last_node = row, match.node
        req.kv_len = req.cached_len = match.length
        table = self._rows.table
        table[row, : match.length] = match.slots
        table[row, match.length: match.length + n] = slots
        self._live[row] = req
        return True

    # ------------------------------------------------------------------ allocation
    def alloc_extend(self, batch: Sequence[tuple[Req, int]]) -> bool:
        """Slots for the next ``n`` tokens of each admitted request, from one allocation
        (evicting when short); False when they cannot all be obtained (nothing taken)."""
        slots = self._alloc(sum(n for _, n in batch))
        if slots is None:
            return False
        at, table = 0, self._rows.table
        for req, n in batch:
            table[req.row, req.kv_len: req.kv_len + n] = slots[at: at + n]
            at += n
        return True

    def make_room(self, n: int) -> bool:
        """Evict unlocked cache entries until ``n`` slots are free; True when they are (with a
        sliding pool, also ``n`` sliding slots, reclaimed from tokens no window reads)."""
        short = n - self._allocator.available_size()
        if short > 0:
            self._cache.evict(short)
        if self._swa is not None and n > self._swa.sliding_available():
            reclaim_sliding(self._swa, self._cache, self._windows(), n - self._swa.sliding_available())
            if n > self._swa.sliding_available():
                return False
        return n <= self._allocator.available_size()

    def alloc_decode(self, reqs: Sequence[Req]) -> None:
        """One slot at ``kv_len`` for each request; ``make_room(len(reqs))`` returned True."""
        slots = self._allocator.alloc(len(reqs))
        assert slots is not None, "alloc_decode without make_room"
        table = self._rows.table
        for req, slot in zip(reqs, slots.tolist()):
            table[req.row, req.kv_len] = slot

    def free_tail(self, req: Req, n: int) -> None:
        """Return slots allocated for ``n`` positions after ``kv_len`` that were never used."""
        row = self._rows.table[req.row]
        self._allocator.free(row[req.kv_len: req.kv_len + n].astype(np.int64))

    def discard_rejected(self, req: Req, n: int) -> None:
        """Speculative decoding: the step computed ``n`` positions after ``kv_len`` that the
        target rejected (or a stop cut off).  The caller has advanced ``kv_len`` past the kept
        tokens; their slots go back to the allocator at once and the row forgets them."""
        if n > 0:
            self.free_tail(req, n)
            self._rows.table[req.row, req.kv_len: req.kv_len + n] = 0

    def continuation(self, req: Req, n: int) -> list[int]:
        """Up to ``n`` tokens the prefix cache holds right after ``req``'s text (read-only: no
        lock, split or LRU stamp changes)."""
        if req.last_node is None:
            return []
        return continuation(req.last_node, req.fill_ids[req.cached_len:], n, req.cache_salt)

    def _alloc(self, n: int) -> Optional[np.ndarray]:
        self.make_room(n)
        return self._allocator.alloc(n)

    def sliding_slots(self, slots: np.ndarray) -> Optional[np.ndarray]:
        """The sliding slot of each of ``slots`` (0: freed) for the worker's sliding-layer
        table, or None without a sliding pool."""
        return None if self._swa is None else self._swa.sliding_of(slots)

    # ------------------------------------------------------------------ documents
    def place_documents(self, req: Req, exact: int) -> None:
        """Decide ``req``'s reused documents after its exact match of ``exact`` tokens
        (``scheduler/documents.py``), locking the document nodes it reuses until ``release``
        (or ``drop_documents``)."""
        place(req, exact, self._lookup_document, self._cache.dec_lock_ref)

    def _lookup_document(self, tokens: list[int], salt: str) -> Optional[tuple[np.ndarray, TreeNode]]:
        if self._cache.tiered:
            self._cache.fetch(tokens, salt)
        slots, node = self._cache.match_prefix(tokens, salt)
        if not len(slots):
            return None
        self._cache.inc_lock_ref(node)  # at once: the next look-up may evict (a tier fetch)
        return slots, node

    @property
    def cache_kind(self) -> str:
        """The prefix cache's kind: "radix", "hierarchical" or "none"."""
        return self._cache.kind

    def document_cached(self, tokens: list[int], salt: str) -> bool:
        """Whether a document's KV is cached whole (in any tier).  Locks nothing."""
        return self._cache.cached_len(tokens, salt) == len(tokens)

    def drop_documents(self, req: Req) -> None:
        """Forget ``req``'s placement and unlock its document nodes (admission did not go on)."""
        for node in clear_placement(req):
            self._cache.dec_lock_ref(node)

    @staticmethod
    def _cacheable(req: Req) -> int:
        """How many leading tokens of ``req``'s row may enter the cache: all it computed, but
        never KV placed from reused documents (approximate), nor what follows it."""
        blend = req.doc.blend_from if req.doc is not None else None
        return req.kv_len if blend is None else min(req.kv_len, blend)

    # ------------------------------------------------------------------ caching
    def cache_unfinished(self, req: Req) -> bool:
        """Hand the computed tokens to the cache and move the lock to where they end.
        Returns True when the row was rewritten (duplicates replaced by cached slots), in
        which case the worker's copy of the row must be resent."""
        upto = self._cacheable(req)
        if upto <= req.cached_len:
            return False
        row = self._rows.table[req.row]
        got = self._cache.cache_unfinished(req.fill_ids[:upto], row[:upto].astype(np.int64),
                                           req.cached_len, req.last_node, req.cache_salt)
        if got is None:
            return False
        if got.slots is not None:
            row[:upto] = got.slots
        req.last_node, req.cached_len = got.node, upto
        return got.slots is not None

    def release(self, req: Req) -> None:
        """A finished or retracted request gives up its row: its computed KV goes to the cache
        (or back to the allocator) and its locks are dropped.  Slots allocated past ``kv_len``
        must have been computed or returned with ``free_tail`` first."""
        row = self._rows.table[req.row]
        upto = self._cacheable(req)
        self._cache.cache_finished(req.fill_ids[:upto], row[:upto].astype(np.int64), req.cached_len, req.last_node,
                                   req.cache_salt)
        if upto < req.kv_len:  # after a reused document: approximate KV, never cached
            self._allocator.free(row[upto: req.kv_len].astype(np.int64))
        self.drop_documents(req)
        self._rows.free(req.row)
        del self._live[req.row]
        req.row, req.last_node, req.kv_len, req.cached_len = None, None, 0, 0
        req.on_worker = False

    # ------------------------------------------------------------------ admin
    def held(self) -> list[tuple[np.ndarray, Optional[TreeNode]]]:
        """(slots held, locked node) of every request holding a row, for the invariants."""
        table = self._rows.table
        out = [(table[r][req.cached_len: req.kv_len].astype(np.int64), req.last_node) for r, req in self._live.items()]
        none = np.zeros(0, dtype=np.int64)
        return out + [(none, node) for req in self._live.values() if req.doc is not None for node in req.doc.nodes]

    def check_invariants(self, held: Optional[Iterable[tuple[np.ndarray, Any]]] = None) -> None:
        """Raise AssertionError unless every slot is in exactly one state (``held``: the
        requests' slots, ``held()`` by default)."""
        check_memory_invariants(self._allocator, self._cache, self.held() if held is None else held)

    def flush(self) -> bool:
        """Drop every cached token; refused (False) while a running request locks any."""
        return self._cache.flush()
