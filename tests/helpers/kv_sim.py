"""The KVManager simulator of test_kv_manager_fuzz.py.

The simulation (``KVSim``) drives a real SlotAllocator + RadixCache (or NoPrefixCache) +
ReqToTokenPool through KVManager the way the scheduler does (match_and_lock -> admit;
alloc_extend; compute; cache_unfinished; release on finish or retraction; evict; flush) with
token sequences over a 3-letter alphabet that reuse each other's prefixes, and after every
step checks ``check_memory_invariants`` plus that each running request's view of its
cached prefix agrees with the tree.

Each operation draws its choices from a chooser: ``HypChoice`` (hypothesis data, which
shrinks) or ``RandChoice`` (a seeded ``random.Random``).
"""
from __future__ import annotations

import random
from collections import Counter

import numpy as np
from hypothesis import event
from hypothesis import strategies as st

from tests.helpers.kv_helpers import make_kv
from radixserve.mem_cache.invariants import check_memory_invariants
from radixserve.mem_cache.prefix_cache import PrefixCache
from radixserve.mem_cache.tree_node import TreeNode
from radixserve.sampling_params import SamplingParams
from radixserve.scheduler.req import Req


def path_of(cache: PrefixCache, node: TreeNode) -> tuple[list[int], list[int]]:
    """(tokens, slots) spelled from the root down to ``node``, without touching the tree."""
    parts = []
    while node is not cache.root:
        assert node is not None, "node is not attached under the current root"
        parts.append(node)
        node = node.parent
    keys, vals = [], []
    for n in reversed(parts):
        keys += n.key
        vals += n.value.tolist()
    return keys, vals


# =========================================================================== simulation
# A simulator of requests against a real SlotAllocator + RadixCache + ReqToTokenPool through
# KVManager, driven two ways: a hypothesis RuleBasedStateMachine (shrinks failures to a short
# step list) and a seeded random fuzzer (many long runs with weighted operations, which
# reaches memory pressure, eviction inside an allocation and row rewrites far more often).
NUM_SLOTS = 32  # 31 usable: small, so allocation failures and eviction under pressure happen
MAX_ROWS = 6
MAX_CTX = 40
MAX_PROMPT = 16
MAX_FILL = 24  # prompt + sampled tokens
ALPHABET = 3  # tokens 1..3: sequences share prefixes often


class HypChoice:
    def __init__(self, data) -> None:
        self.data = data

    def int(self, lo: int, hi: int, label: str = "") -> int:
        return self.data.draw(st.integers(lo, hi), label=label or None)

    def bool(self, label: str = "") -> bool:
        return self.data.draw(st.booleans(), label=label or None)

    def tokens(self, lo: int, hi: int) -> list[int]:
        return self.data.draw(st.lists(st.integers(1, ALPHABET), min_size=lo, max_size=hi), label="tokens")

    @staticmethod
    def event(name: str) -> None:
        event(name)


class RandChoice:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def int(self, lo: int, hi: int, label: str = "") -> int:
        return self.rng.randint(lo, hi)

    def bool(self, label: str = "") -> bool:
        return self.rng.random() < 0.5

    def tokens(self, lo: int, hi: int) -> list[int]:
        return [self.rng.randint(1, ALPHABET) for _ in range(self.rng.randint(lo, hi))]

    @staticmethod
    def event(name: str) -> None:
        pass


class KVSim:
    """Requests driven the way the scheduler drives them (match_and_lock -> admit or unlock;
    alloc_extend; compute; cache_unfinished; release on finish or retraction).

    Beyond the scheduler's ``row[cached_len:kv_len]``, a request may also hold ``pending``
    slots allocated for its next step but not computed yet (``row[kv_len:kv_len+pending]``);
    they count as held by it in the invariant check.  Every operation returns without doing
    anything when it does not apply (no live request, ...).
    """

    OPS = ("admit", "alloc_next", "compute", "cache_unfinished", "abort_step", "finish", "retract",
           "evict", "match_random", "flush")

    def __init__(self, disable: bool = False) -> None:
        self.disable = disable
        self.kv, self.allocator, self.cache, self.rows = make_kv(NUM_SLOTS, MAX_ROWS, MAX_CTX, disable)
        self.live: list[Req] = []
        self.waiting: list[Req] = []  # retracted, to be admitted again
        self.pending: dict[str, int] = {}
        self.seqs: list[list[int]] = []  # sequences seen so far, to draw shared prefixes from
        self.n_reqs = 0
        self.hits = self.queries = 0
        self.events: Counter = Counter()
        self.c = None  # the current chooser

    # ------------------------------------------------------------------ helpers
    def _event(self, name: str) -> None:
        self.events[name] += 1
        self.c.event(name)

    def _draw_key(self, max_len: int) -> list[int]:
        c, base = self.c, []
        if self.seqs and c.int(0, 3, "share a prefix"):
            s = self.seqs[c.int(0, len(self.seqs) - 1, "from")]
            base = s[: c.int(0, len(s), "cut")]
        return (base + c.tokens(0 if base else 1, 8))[:max_len]

    def _pick(self, reqs: list[Req]) -> Req:
        return reqs[self.c.int(0, len(reqs) - 1, "req")]

    def held(self):
        out = []
        for r in self.live:
            row = self.kv.row(r)
            out.append((row[r.cached_len: r.kv_len + self.pending[r.rid]].astype(np.int64), r.last_node))
        return out

    def _alloc(self, n: int, req: Req, allocate):
        """``allocate()`` (kv.admit or kv.alloc_extend of n slots for ``req``), checking it fails
        exactly when n exceeds free + evictable; returns the new slots (or None)."""
        obtainable = self.kv.available()
        ev_before, free_before = self.cache.evictable_size, self.allocator.available_size()
        if not allocate():
            self._event("alloc_slots failed")
            assert n > obtainable, f"alloc_slots({n}) failed with {obtainable} obtainable"
            assert self.allocator.available_size() + self.cache.evictable_size == obtainable
            return None
        assert n <= obtainable, f"alloc_slots({n}) succeeded with only {obtainable} obtainable"
        slots = self.kv.row(req)[req.kv_len: req.kv_len + n].astype(np.int64)
        got = slots.tolist()
        assert len(got) == n and len(set(got)) == n and 0 not in got
        evicted = ev_before - self.cache.evictable_size
        assert evicted == 0 or n > free_before, "alloc_slots evicted without being short"
        if evicted:
            self._event("alloc_slots evicted")
        assert self.allocator.available_size() == free_before + evicted - n
        return slots

    def step(self, op: str, c) -> None:
        self.c = c
        getattr(self, op)()

    # ------------------------------------------------------------------ operations
    def admit(self) -> None:
        """match_and_lock -> kv.admit of the (first chunk of the) rest, or unlock."""
        if len(self.live) >= MAX_ROWS:
            return
        c = self.c
        if self.waiting and c.bool("readmit"):
            req = self.waiting.pop(c.int(0, len(self.waiting) - 1, "which"))
            self._event("readmit")
        else:
            req = Req(f"r{self.n_reqs}", self._draw_key(MAX_PROMPT), SamplingParams())
            self.n_reqs += 1
            self.seqs.append(list(req.input_ids))
        limit = req.prefix_match_limit()
        assert limit == req.fill_len - 1
        match = self.kv.match_and_lock(req)
        prefix, node = match
        keys, vals = path_of(self.cache, node)
        assert keys == req.fill_ids[: len(prefix)] and vals == prefix.tolist()
        if self.disable:
            assert prefix.size == 0 and node is self.cache.root
        extend = req.fill_len - len(prefix)
        n = extend if c.bool("whole") else c.int(1, extend, "chunk")
        slots = self._alloc(n, req, lambda: self.kv.admit(req, match, n))
        if slots is None:
            self.kv.unlock(match)
            if req.admitted_once:
                self.waiting.append(req)
            return
        self._event("admitted with a cache hit" if len(prefix) else "admitted without a hit")
        assert (req.kv_len, req.cached_len, req.last_node) == (len(prefix), len(prefix), node)
        assert self.kv.row(req)[: len(prefix) + n].tolist() == prefix.tolist() + slots.tolist()
        if not req.admitted_once:
            req.admitted_once = True
            req.cached_tokens = len(prefix)
            self.kv.record_hit(len(prefix), len(req.input_ids))
            self.hits += len(prefix)
            self.queries += len(req.input_ids)
        self.live.append(req)
        self.pending[req.rid] = n

    def alloc_next(self) -> None:
        """Slots for the next chunk of a chunked prefill, or for a decode step."""
        cands = [r for r in self.live if self.pending[r.rid] == 0 and r.kv_len < r.fill_len]
        if not cands:
            return
        req = self._pick(cands)
        n = self.c.int(1, req.fill_len - req.kv_len, "n")
        slots = self._alloc(n, req, lambda: self.kv.alloc_extend([(req, n)]))
        if slots is not None:
            self.pending[req.rid] = n

    def compute(self) -> None:
        """The forward pass ran: kv_len advances; at the end of the sequence sample a token."""
        cands = [r for r in self.live if self.pending[r.rid]]
        if not cands:
            return
        req = self._pick(cands)
        req.kv_len += self.pending[req.rid]
        self.pending[req.rid] = 0
        assert req.kv_len <= req.fill_len
        if req.kv_len == req.fill_len and req.fill_len < MAX_FILL and self.c.int(0, 3, "sample"):
            req.output_ids.append(self.c.int(1, ALPHABET, "token"))
        if self.c.bool("cache now"):
            self._cache_unfinished(req)

    def cache_unfinished(self) -> None:
        if self.live:
            self._cache_unfinished(self._pick(self.live))

    def _cache_unfinished(self, req: Req) -> None:
        cached, kv_len = req.cached_len, req.kv_len
        old = self.kv.row(req)[:kv_len].copy()
        old_node = req.last_node
        rewritten = self.kv.cache_unfinished(req)
        new = self.kv.row(req)[:kv_len]
        if self.disable or kv_len <= cached:
            assert rewritten is False
            assert (req.cached_len, req.last_node) == (cached, old_node)
        else:
            assert req.cached_len == kv_len
            assert path_of(self.cache, req.last_node)[0] == req.fill_ids[:kv_len]
        assert np.array_equal(new[:cached], old[:cached]), "cache_unfinished changed the cached prefix"
        if rewritten:
            self._event("cache_unfinished rewrote a row")
            assert not np.array_equal(new, old)
        else:
            assert np.array_equal(new, old), "row changed but cache_unfinished returned False"

    def abort_step(self) -> None:
        """The step did not run: give back the slots allocated past kv_len."""
        cands = [r for r in self.live if self.pending[r.rid]]
        if not cands:
            return
        req = self._pick(cands)
        before = self.allocator.available_size()
        self.kv.free_tail(req, self.pending[req.rid])
        assert self.allocator.available_size() == before + self.pending[req.rid]
        self.pending[req.rid] = 0

    def _release(self, req: Req) -> None:
        if self.pending[req.rid]:
            self.kv.free_tail(req, self.pending[req.rid])
        del self.pending[req.rid]
        rows_before = self.rows.available_size()
        tree_before = self.cache.total_size()
        self.kv.release(req)
        assert (req.row, req.last_node, req.kv_len, req.cached_len) == (None, None, 0, 0)
        assert self.rows.available_size() == rows_before + 1
        assert self.cache.total_size() >= tree_before
        self.live.remove(req)

    def finish(self) -> None:
        if self.live:
            self._release(self._pick(self.live))

    def retract(self) -> None:
        """Like the scheduler's _retract: release (the computed prefix stays cached), re-queue."""
        if self.live:
            req = self._pick(self.live)
            self._release(req)
            req.retractions += 1
            self.waiting.append(req)

    def evict(self) -> None:
        k = self.c.int(0, NUM_SLOTS, "k")
        ev, free, total_ev = self.cache.evictable_size, self.allocator.available_size(), self.cache.evicted_tokens
        prot = self.cache.protected_size
        freed = self.cache.evict(k)
        assert 0 <= freed <= ev
        if k > 0:
            assert freed >= min(k, ev), f"evict({k}) freed {freed} of {ev} evictable"
        assert self.cache.evictable_size == ev - freed and self.cache.protected_size == prot
        assert self.allocator.available_size() == free + freed
        assert self.cache.evicted_tokens == total_ev + freed

    def match_random(self) -> None:
        """A lookup of some key (as the scheduler's LPM ordering does): may split nodes."""
        key = self._draw_key(MAX_FILL)
        slots, node = self.cache.match_prefix(key)
        keys, vals = path_of(self.cache, node)
        assert keys == key[: len(slots)] and vals == slots.tolist()
        if len(slots) < len(key):
            assert key[len(slots)] not in node.children, "match_prefix stopped early"

    def flush(self) -> None:
        if self.cache.protected_size:
            self._event("flush refused")
            size = self.cache.total_size()
            assert self.kv.flush() is False
            assert self.cache.total_size() == size
        else:  # also with running requests that lock nothing (they point at the root)
            free, ev = self.allocator.available_size(), self.cache.evictable_size
            assert self.kv.flush() is True
            self._event("flush done" if ev else "flush of an empty cache")
            assert self.cache.total_size() == 0 and self.cache.all_nodes() == []
            assert self.allocator.available_size() == free + ev

    # ------------------------------------------------------------------ checks
    def check(self) -> None:
        check_memory_invariants(self.allocator, self.cache, self.held())
        assert self.rows.available_size() == MAX_ROWS - len(self.live)
        assert len({r.row for r in self.live}) == len(self.live)
        assert (self.cache.hit_tokens, self.cache.query_tokens) == (self.hits, self.queries)
        if self.disable:
            assert self.cache.total_size() == 0 and self.cache.root.children == {}
        for r in self.live:
            assert 0 <= r.cached_len <= r.kv_len and r.kv_len + self.pending[r.rid] <= r.fill_len
            row = self.kv.row(r)
            keys, vals = path_of(self.cache, r.last_node)  # read-only walk first
            assert keys == r.fill_ids[: r.cached_len], f"{r.rid}: locked path spells the wrong tokens"
            assert vals == row[: r.cached_len].tolist(), f"{r.rid}: row disagrees with the locked path"
            slots, node = self.cache.match_prefix(r.fill_ids[: r.cached_len])  # may split: fine
            assert slots.tolist() == row[: r.cached_len].tolist(), f"{r.rid}: row disagrees with match_prefix"
            assert node is r.last_node, f"{r.rid}: match_prefix ends elsewhere than the locked node"

    def drain(self) -> None:
        """Release everything, evict everything: every slot must be free again."""
        for r in list(self.live):
            self._release(r)
        check_memory_invariants(self.allocator, self.cache, [])
        assert self.cache.protected_size == 0
        self.cache.evict(NUM_SLOTS)
        assert self.cache.total_size() == 0 and self.cache.all_nodes() == []
        assert self.allocator.available_size() == NUM_SLOTS - 1
        assert self.allocator.free_slots().tolist() == list(range(1, NUM_SLOTS))
        assert self.rows.available_size() == MAX_ROWS
