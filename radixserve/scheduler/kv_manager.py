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
"""
from __future__ import annotations

from typing import Any, Iterable, NamedTuple, Optional, Sequence

import torch

from radixserve.mem_cache.allocator import SlotAllocator
from radixserve.ipc.persist_link import PersistNode
from radixserve.mem_cache.continuation import continuation
from radixserve.mem_cache.hot_prefixes import insert_restored, select_hot
from radixserve.mem_cache.invariants import check_memory_invariants
from radixserve.mem_cache.no_prefix_cache import NoPrefixCache
from radixserve.mem_cache.prefix_cache import PrefixCache
from radixserve.mem_cache.radix_cache import RadixCache
from radixserve.mem_cache.req_to_token import ReqToTokenPool
from radixserve.mem_cache.tree_inspect import tree_snapshot
from radixserve.mem_cache.tree_node import TreeNode
from radixserve.scheduler.req import Req


class PrefixMatch(NamedTuple):
    """A cached prefix, locked (``match_and_lock``) until ``admit`` or ``unlock``."""

    slots: torch.Tensor
    node: TreeNode

    @property
    def length(self) -> int:
        return len(self.slots)


class KVManager:
    def __init__(self, num_slots: int, max_rows: int, max_context_len: int, disable_radix_cache: bool = False) -> None:
        """The prefix cache is chosen here, once: a ``RadixCache``, or a ``NoPrefixCache``
        with ``disable_radix_cache``."""
        allocator = SlotAllocator(num_slots)
        cache = NoPrefixCache(allocator.free) if disable_radix_cache else RadixCache(allocator.free)
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

    # ------------------------------------------------------------------ queries
    @property
    def capacity(self) -> int:
        return self._allocator.num_slots - 1

    def available(self) -> int:
        """Slots obtainable now: free ones plus unlocked cached ones."""
        return self._allocator.available_size() + self._cache.evictable_size

    def free_slots(self) -> int:
        """Slots free in the allocator (without evicting)."""
        return self._allocator.available_size()

    def row(self, req: Req) -> torch.Tensor:
        """The request's row of slots (int32).  Read-only for the caller."""
        return self._rows.table[req.row]

    def match_len(self, req: Req) -> int:
        """How many leading tokens of ``req`` are cached (refreshes their LRU stamps; may
        split a node).  Locks nothing."""
        slots, _ = self._cache.match_prefix(req.fill_ids[: req.prefix_match_limit()], req.cache_salt)
        return len(slots)

    # ------------------------------------------------------------------ admission
    def match_and_lock(self, req: Req) -> PrefixMatch:
        """The cached prefix ``req`` may use, locked so that it cannot be evicted: the caller
        either ``admit``s the request with it or ``unlock``s it."""
        slots, node = self._cache.match_prefix(req.fill_ids[: req.prefix_match_limit()], req.cache_salt)
        self._cache.inc_lock_ref(node)
        return PrefixMatch(slots, node)

    def unlock(self, match: PrefixMatch) -> None:
        self._cache.dec_lock_ref(match.node)

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
        row = self._rows.alloc()
        assert row is not None, "request rows exhausted (max_running_requests)"
        req.row, req.last_node = row, match.node
        req.kv_len = req.cached_len = match.length
        table = self._rows.table
        table[row, : match.length] = match.slots.to(torch.int32)
        table[row, match.length: match.length + n] = slots.to(torch.int32)
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
            table[req.row, req.kv_len: req.kv_len + n] = slots[at: at + n].to(torch.int32)
            at += n
        return True

    def make_room(self, n: int) -> bool:
        """Evict unlocked cache entries until ``n`` slots are free; True when they are."""
        short = n - self._allocator.available_size()
        if short > 0:
            self._cache.evict(short)
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
        self._allocator.free(row[req.kv_len: req.kv_len + n].long().clone())

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

    def _alloc(self, n: int) -> Optional[torch.Tensor]:
        self.make_room(n)
        return self._allocator.alloc(n)

    # ------------------------------------------------------------------ caching
    def cache_unfinished(self, req: Req) -> bool:
        """Hand the computed tokens to the cache and move the lock to where they end.
        Returns True when the row was rewritten (duplicates replaced by cached slots), in
        which case the worker's copy of the row must be resent."""
        if req.kv_len <= req.cached_len:
            return False
        row = self._rows.table[req.row]
        got = self._cache.cache_unfinished(req.fill_ids[: req.kv_len], row[: req.kv_len].long(),
                                           req.cached_len, req.last_node, req.cache_salt)
        if got is None:
            return False
        if got.slots is not None:
            row[: req.kv_len] = got.slots.to(torch.int32)
        req.last_node, req.cached_len = got.node, req.kv_len
        return got.slots is not None

    def release(self, req: Req) -> None:
        """A finished or retracted request gives up its row: its computed KV goes to the cache
        (or back to the allocator) and its lock is dropped.  Slots allocated past ``kv_len``
        must have been computed or returned with ``free_tail`` first."""
        row = self._rows.table[req.row]
        self._cache.cache_finished(req.fill_ids[: req.kv_len], row[: req.kv_len].long(), req.cached_len, req.last_node,
                                   req.cache_salt)
        self._rows.free(req.row)
        del self._live[req.row]
        req.row, req.last_node, req.kv_len, req.cached_len = None, None, 0, 0
        req.on_worker = False

    # ------------------------------------------------------------------ admin
    def held(self) -> list[tuple[torch.Tensor, Optional[TreeNode]]]:
        """(slots held, locked node) of every request holding a row, for the invariants."""
        table = self._rows.table
        return [(table[r][req.cached_len: req.kv_len].long(), req.last_node) for r, req in self._live.items()]

    def check_invariants(self, held: Optional[Iterable[tuple[torch.Tensor, Any]]] = None) -> None:
        """Raise AssertionError unless every slot is in exactly one state (``held``: the
        requests' slots, ``held()`` by default)."""
        check_memory_invariants(self._allocator, self._cache, self.held() if held is None else held)

    def stats(self) -> dict[str, Any]:
        s: dict[str, Any] = dict(self._cache.stats())
        s.update(free_slots=self._allocator.available_size(), num_slots=self.capacity)
        return s

    def cache_tree(self, max_depth: int, max_nodes: int, with_tokens: bool) -> dict[str, Any]:
        """The inspector's bounded, read-only snapshot of the tree (``mem_cache/tree_inspect.py``)."""
        return tree_snapshot(self._cache, max_depth, max_nodes, with_tokens)

    def cache_stats(self) -> dict[str, Any]:
        """The inspector's counters: hit rate and evictions over time windows, tree and KV sizes."""
        c, free = self._cache, self._allocator.available_size()
        s: dict[str, Any] = {"cache": c.kind, **c.counters.snapshot()}
        s["tree"] = {"tokens": c.total_size(), "nodes": c.num_nodes, "evictable_tokens": c.evictable_size,
                     "protected_tokens": c.protected_size}
        s["kv"] = {"num_slots": self.capacity, "free_slots": free, "cached_slots": c.total_size(),
                   "held_slots": self.capacity - free - c.total_size(),
                   "used_fraction": (self.capacity - free) / max(1, self.capacity)}
        return s

    def flush(self) -> bool:
        """Drop every cached token; refused (False) while a running request locks any."""
        return self._cache.flush()

    # ------------------------------------------------------------------ warm restart
    def hot_prefixes(self, max_tokens: int) -> tuple[list[PersistNode], torch.Tensor]:
        """The hottest cached prefixes (``mem_cache/hot_prefixes.py``) and their slots;
        read-only.  Nothing without a sharing cache."""
        if not isinstance(self._cache, RadixCache):
            return [], torch.empty(0, dtype=torch.int64)
        return select_hot(self._cache.root, max_tokens)

    def reserve_for_restore(self, n: int) -> torch.Tensor:
        """Up to ``n`` free slots (no eviction) that must go back through ``adopt``."""
        n = min(n, self._allocator.available_size()) if isinstance(self._cache, RadixCache) else 0
        return self._allocator.alloc(n) if n > 0 else torch.empty(0, dtype=torch.int64)

    def adopt(self, nodes: list[PersistNode], slots: torch.Tensor, used: int) -> int:
        """Insert restored nodes whose KV the worker wrote into ``slots[:used]`` (unlocked,
        evictable); frees every reserved slot the tree does not keep.  Returns tokens kept."""
        taken = insert_restored(self._cache, nodes, slots[:used], self._allocator.free) if used else 0
        self._allocator.free(slots[used:].clone())
        return taken
