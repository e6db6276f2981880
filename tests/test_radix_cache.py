"""RadixCache semantics (unit tests) and randomized simulation of KVManager.

The simulation (``KVSim``) drives a real SlotAllocator + RadixCache (or NoPrefixCache) +
ReqToTokenPool through KVManager the way the scheduler does (match_and_lock -> admit;
alloc_extend; compute; cache_unfinished; release on finish or retraction; evict; flush) with
token sequences over a 3-letter alphabet that reuse each other's prefixes, and after every
step checks ``check_memory_invariants`` plus that each running request's view of its
cached prefix agrees with the tree.  It runs both as a hypothesis RuleBasedStateMachine
(shrinking) and as a seeded random fuzzer (long weighted runs, many seeds).
"""
from __future__ import annotations

import random
from collections import Counter

import pytest
import torch
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from radixserve.mem_cache.allocator import SlotAllocator
from radixserve.mem_cache.invariants import check_memory_invariants
from radixserve.mem_cache.no_prefix_cache import NoPrefixCache
from radixserve.mem_cache.prefix_cache import PrefixCache
from radixserve.mem_cache.radix_cache import RadixCache
from radixserve.mem_cache.req_to_token import ReqToTokenPool
from radixserve.mem_cache.tree_node import TreeNode
from radixserve.sampling_params import SamplingParams
from radixserve.scheduler.kv_manager import KVManager
from radixserve.scheduler.req import Req


def T(*xs: int) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.int64)


class Recorder:
    """free_fn that remembers each freed batch of slots, in order."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def __call__(self, slots: torch.Tensor) -> None:
        self.batches.append(slots.tolist())

    def flat(self) -> list[int]:
        return [s for b in self.batches for s in b]


def make_cache(disable: bool = False) -> tuple[PrefixCache, Recorder]:
    rec = Recorder()
    return (NoPrefixCache if disable else RadixCache)(rec), rec


def make_kv(num_slots: int, max_rows: int, max_ctx: int,
            disable: bool = False) -> tuple[KVManager, SlotAllocator, PrefixCache, ReqToTokenPool]:
    """A KVManager over parts the test keeps, to look behind the interface."""
    allocator = SlotAllocator(num_slots)
    cache = (NoPrefixCache if disable else RadixCache)(allocator.free)
    rows = ReqToTokenPool(max_rows, max_ctx)
    return KVManager.from_parts(allocator, cache, rows), allocator, cache, rows


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


def shape(cache: RadixCache, node: TreeNode | None = None):
    """Nested (key, value, children) description of the subtree for structural asserts."""
    node = cache.root if node is None else node
    return {k: (c.key, c.value.tolist(), shape(cache, c)) for k, c in sorted(node.children.items())}


# =========================================================================== unit tests
def test_match_prefix_splits_so_match_ends_on_node_boundary():
    cache, _ = make_cache()
    assert cache.insert([1, 2, 3, 4], T(10, 11, 12, 13)) == 0
    assert shape(cache) == {1: ([1, 2, 3, 4], [10, 11, 12, 13], {})}

    slots, node = cache.match_prefix([1, 2, 9])
    assert slots.tolist() == [10, 11]
    assert node.key == [1, 2] and node.value.tolist() == [10, 11]
    assert node.parent is cache.root and cache.root.children[1] is node
    lower = node.children[3]
    assert lower.key == [3, 4] and lower.value.tolist() == [12, 13] and lower.parent is node
    assert shape(cache) == {1: ([1, 2], [10, 11], {3: ([3, 4], [12, 13], {})})}
    assert cache.total_size() == cache.evictable_size == 4  # a split moves no tokens

    # a match ending exactly on a boundary splits nothing
    slots2, node2 = cache.match_prefix([1, 2])
    assert node2 is node and slots2.tolist() == [10, 11] and len(cache.all_nodes()) == 2
    # a longer key stops at the end of the tree
    slots3, node3 = cache.match_prefix([1, 2, 3, 4, 5, 6])
    assert slots3.tolist() == [10, 11, 12, 13] and node3 is lower
    # no match / empty key -> root
    for key in ([], [7], [2, 1]):
        s, n = cache.match_prefix(key)
        assert s.numel() == 0 and n is cache.root
    # a split inside the lower node keeps the lower node's identity at the bottom
    s4, n4 = cache.match_prefix([1, 2, 3])
    assert s4.tolist() == [10, 11, 12] and n4.key == [3] and n4.children[4] is lower
    assert lower.key == [4] and lower.parent is n4
    check_memory_invariants_tree_only(cache)


def check_memory_invariants_tree_only(cache: RadixCache) -> None:
    """Structure + size accounting of the tree alone (no allocator)."""
    ev = pr = 0
    seen = set()
    for n in cache.all_nodes():
        assert len(n.key) == n.value.numel() > 0
        assert n.parent.children[n.key[0]] is n
        for s in n.value.tolist():
            assert s not in seen
            seen.add(s)
        if n.lock_ref:
            pr += len(n.key)
        else:
            ev += len(n.key)
    assert (ev, pr) == (cache.evictable_size, cache.protected_size)


def test_insert_returns_length_already_cached():
    cache, rec = make_cache()
    assert cache.insert([1, 2, 3], T(10, 11, 12)) == 0
    assert cache.insert([1, 2, 3], T(20, 21, 22)) == 3  # fully cached: tree keeps its slots
    assert cache.match_prefix([1, 2, 3])[0].tolist() == [10, 11, 12]
    assert cache.insert([1, 2, 5, 6], T(30, 31, 32, 33)) == 2  # diverges after 2
    assert shape(cache) == {1: ([1, 2], [10, 11], {3: ([3], [12], {}), 5: ([5, 6], [32, 33], {})})}
    assert cache.evictable_size == 5
    assert cache.insert([1], T(40)) == 1  # a prefix of cached tokens: all cached
    assert cache.insert([9], T(50)) == 0
    assert cache.insert([], T()) == 0
    assert cache.total_size() == 6
    assert rec.batches == []  # insert never frees: duplicates are the caller's
    check_memory_invariants_tree_only(cache)


def test_insert_extending_an_existing_key():
    cache, _ = make_cache()
    assert cache.insert([1, 2], T(10, 11)) == 0
    leaf = cache.root.children[1]
    value = T(20, 21, 12, 13)
    assert cache.insert([1, 2, 3, 4], value) == 2
    assert cache.root.children[1] is leaf and leaf.key == [1, 2]  # not split, extended below
    assert shape(cache) == {1: ([1, 2], [10, 11], {3: ([3, 4], [12, 13], {})})}
    value[2:] = 99  # the tree stored a copy
    assert cache.match_prefix([1, 2, 3, 4])[0].tolist() == [10, 11, 12, 13]
    assert cache.evictable_size == 4


def test_lock_ref_propagates_to_the_root():
    cache, _ = make_cache()
    cache.insert([1, 2, 3, 4], T(10, 11, 12, 13))
    cache.insert([1, 2, 5], T(10, 11, 15))
    a = cache.root.children[1]
    b, c = a.children[3], a.children[5]
    assert (a.key, b.key, c.key) == ([1, 2], [3, 4], [5])
    assert (cache.evictable_size, cache.protected_size) == (5, 0)

    cache.inc_lock_ref(b)
    assert (a.lock_ref, b.lock_ref, c.lock_ref) == (1, 1, 0)
    assert (cache.evictable_size, cache.protected_size) == (1, 4)
    cache.inc_lock_ref(c)
    assert (a.lock_ref, b.lock_ref, c.lock_ref) == (2, 1, 1)
    assert (cache.evictable_size, cache.protected_size) == (0, 5)
    cache.inc_lock_ref(b)  # a second lock on the same path moves no size
    assert (a.lock_ref, b.lock_ref) == (3, 2) and cache.protected_size == 5
    cache.dec_lock_ref(b)
    cache.dec_lock_ref(b)
    assert (a.lock_ref, b.lock_ref, c.lock_ref) == (1, 0, 1)
    assert (cache.evictable_size, cache.protected_size) == (2, 3)
    cache.dec_lock_ref(c)
    assert (a.lock_ref, b.lock_ref, c.lock_ref) == (0, 0, 0)
    assert (cache.evictable_size, cache.protected_size) == (5, 0)
    root_lock = cache.root.lock_ref
    cache.inc_lock_ref(cache.root)  # locking the root is a no-op
    cache.dec_lock_ref(cache.root)
    assert cache.root.lock_ref == root_lock and cache.evictable_size == 5
    # a split of a locked node copies the lock to the new upper node
    cache.inc_lock_ref(b)
    _, upper = cache.match_prefix([1])
    assert upper.key == [1] and upper.lock_ref == 1 and a.lock_ref == 1
    assert (cache.evictable_size, cache.protected_size) == (1, 4)
    check_memory_invariants_tree_only(cache)
    cache.dec_lock_ref(b)
    with pytest.raises(AssertionError, match="underflow"):
        cache.dec_lock_ref(b)


def test_evict_frees_lru_leaves_first():
    cache, rec = make_cache()
    cache.insert([1], T(10))
    cache.insert([2], T(20))
    cache.insert([3], T(30))
    cache.match_prefix([1])  # touch [1]: LRU order is now [2], [3], [1]
    assert cache.evict(1) == 1
    assert rec.batches == [[20]]
    assert cache.evict(2) == 2
    assert rec.batches == [[20], [30], [10]]
    assert cache.total_size() == 0 and cache.root.children == {}
    assert cache.evicted_tokens == 3
    assert cache.evict(5) == 0  # nothing left
    assert cache.evict(0) == 0


def test_evict_frees_whole_leaves_at_least_n():
    cache, rec = make_cache()
    cache.insert([5, 6, 7], T(50, 51, 52))
    cache.insert([8], T(80))
    assert cache.evict(1) == 3  # the older leaf, whole
    assert rec.batches == [[50, 51, 52]]
    assert cache.evict(-1) == 0 and cache.evictable_size == 1


def test_evict_never_frees_locked_nodes():
    cache, rec = make_cache()
    cache.insert([1, 2], T(10, 11))
    cache.insert([3], T(30))
    _, node = cache.match_prefix([1, 2])
    cache.inc_lock_ref(node)
    assert cache.evict(100) == 1
    assert rec.batches == [[30]]
    assert (cache.evictable_size, cache.protected_size) == (0, 2)
    assert cache.evict(100) == 0  # only locked tokens left
    cache.dec_lock_ref(node)
    assert cache.evict(100) == 2
    assert rec.flat() == [30, 10, 11]

    # locked inner node with an unlocked child: only the child can go, no cascade
    cache2, rec2 = make_cache()
    cache2.insert([1, 2, 3], T(10, 11, 12))
    _, upper = cache2.match_prefix([1])
    cache2.inc_lock_ref(upper)
    assert cache2.evict(100) == 2
    assert rec2.batches == [[11, 12]]
    assert cache2.root.children[1] is upper and upper.children == {}
    assert (cache2.evictable_size, cache2.protected_size) == (0, 1)


def test_evict_cascades_to_parents_that_become_leaves():
    cache, rec = make_cache()
    cache.insert([1, 2, 3], T(10, 11, 12))
    cache.insert([1, 2, 4], T(10, 11, 14))  # A=[1,2] -> B=[3], C=[4]; B older than C
    assert cache.evict(2) == 2
    assert rec.batches == [[12], [14]]  # A became a leaf but 2 tokens were enough
    assert shape(cache) == {1: ([1, 2], [10, 11], {})}
    assert cache.evict(1) == 2
    assert rec.batches == [[12], [14], [10, 11]]

    # a parent that becomes a leaf is ordered by its own last access among the other leaves
    cache, rec = make_cache()
    cache.insert([1, 2, 3], T(10, 11, 12))
    cache.match_prefix([1])  # split: upper [1] is fresher than lower [2, 3]
    cache.insert([9], T(90))  # freshest
    assert cache.evict(3) == 3
    assert rec.batches == [[11, 12], [10]]
    assert shape(cache) == {9: ([9], [90], {})}
    # ... and a parent fresher than another leaf waits for it
    cache, rec = make_cache()
    cache.insert([9], T(90))
    cache.insert([1, 2, 3], T(10, 11, 12))
    cache.match_prefix([1])
    assert cache.evict(4) == 4
    assert rec.batches == [[90], [11, 12], [10]]


def test_flush_refused_while_locked():
    cache, rec = make_cache()
    cache.insert([1, 2], T(10, 11))
    cache.insert([3], T(30))
    _, node = cache.match_prefix([1, 2])
    cache.inc_lock_ref(node)
    assert cache.flush() is False
    assert rec.batches == [] and cache.total_size() == 3
    cache.dec_lock_ref(node)
    assert cache.flush() is True
    assert sorted(rec.flat()) == [10, 11, 30]
    assert cache.total_size() == 0 and cache.root.children == {} and cache.all_nodes() == []
    assert cache.match_prefix([1, 2])[0].numel() == 0
    assert cache.flush() is True  # empty cache flushes fine
    assert cache.insert([1], T(5)) == 0  # still usable


def test_stats():
    cache, _ = make_cache()
    s = cache.stats()
    assert s["hit_rate"] == 0 and s["query_tokens"] == 0 and s["cache_size"] == 0
    cache.insert([1, 2, 3], T(10, 11, 12))
    cache.insert([4], T(40))
    cache.record_hit(3, 10)
    cache.record_hit(0, 5)
    _, node = cache.match_prefix([4])
    cache.inc_lock_ref(node)
    s = cache.stats()
    assert (s["hit_tokens"], s["query_tokens"]) == (3, 15)
    assert s["hit_rate"] == pytest.approx(0.2)
    assert (s["cache_size"], s["evictable_size"], s["protected_size"]) == (4, 3, 1)
    cache.evict(1)
    s = cache.stats()
    assert s["evicted_tokens"] == 3 and s["cache_size"] == 1


def test_disable_makes_cache_inert():
    cache, rec = make_cache(disable=True)
    assert cache.insert([1, 2, 3], T(10, 11, 12)) == 0
    assert cache.insert([1, 2, 3], T(10, 11, 12)) == 0
    slots, node = cache.match_prefix([1, 2, 3])
    assert slots.numel() == 0 and node is cache.root
    assert cache.total_size() == 0 and cache.all_nodes() == []
    assert cache.evict(10) == 0 and rec.batches == []
    assert cache.flush() is True


def test_cache_unfinished_replaces_duplicates_with_tree_slots():
    """Two requests computing the same prompt concurrently: the second one to cache gets its
    row rewritten to the tree's slots and its duplicate slots freed."""
    kv, allocator, cache, _ = make_kv(16, 4, 32)
    a = Req("a", [1, 2, 3, 4], SamplingParams())
    b = Req("b", [1, 2, 3, 4, 5], SamplingParams())
    for r in (a, b):
        match = kv.match_and_lock(r)
        assert match.slots.numel() == 0
        assert kv.admit(r, match, r.fill_len)
        r.kv_len = r.fill_len
    a_row = kv.row(a)[:4].tolist()
    b_row = kv.row(b)[:5].tolist()
    assert kv.cache_unfinished(a) is False  # first to cache: nothing to rewrite
    assert a.cached_len == 4 and a.last_node.lock_ref == 1
    free_before = set(allocator.free_slots().tolist())
    assert kv.cache_unfinished(b) is True
    assert kv.row(b)[:5].tolist() == a_row + b_row[4:]
    assert set(allocator.free_slots().tolist()) - free_before == set(b_row[:4])
    assert b.cached_len == 5 and b.last_node.key == [5] and b.last_node.parent is a.last_node
    assert a.last_node.lock_ref == 2
    check_memory_invariants(allocator, cache, [(kv.row(r)[r.cached_len: r.kv_len].long(), r.last_node)
                                               for r in (a, b)])
    kv.release(a)
    kv.release(b)
    check_memory_invariants(allocator, cache, [])
    assert cache.protected_size == 0 and cache.evictable_size == 5
    cache.evict(100)
    assert allocator.available_size() == 15


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
            out.append((row[r.cached_len: r.kv_len + self.pending[r.rid]].long(), r.last_node))
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
        slots = self.kv.row(req)[req.kv_len: req.kv_len + n].long()
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
            assert prefix.numel() == 0 and node is self.cache.root
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
        old = self.kv.row(req)[:kv_len].clone()
        old_node = req.last_node
        rewritten = self.kv.cache_unfinished(req)
        new = self.kv.row(req)[:kv_len]
        if self.disable or kv_len <= cached:
            assert rewritten is False
            assert (req.cached_len, req.last_node) == (cached, old_node)
        else:
            assert req.cached_len == kv_len
            assert path_of(self.cache, req.last_node)[0] == req.fill_ids[:kv_len]
        assert torch.equal(new[:cached], old[:cached]), "cache_unfinished changed the cached prefix"
        if rewritten:
            self._event("cache_unfinished rewrote a row")
            assert not torch.equal(new, old)
        else:
            assert torch.equal(new, old), "row changed but cache_unfinished returned False"

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


# --------------------------------------------------------------------------- hypothesis
class KVManagerMachine(RuleBasedStateMachine):
    DISABLE = False

    def __init__(self) -> None:
        super().__init__()
        self.sim = KVSim(self.DISABLE)

    @rule(data=st.data(), op=st.sampled_from(KVSim.OPS))
    def op(self, data, op):
        self.sim.step(op, HypChoice(data))

    @invariant()
    def memory_invariants(self):
        self.sim.check()

    def teardown(self):
        self.sim.drain()


_MACHINE_SETTINGS = settings(max_examples=150, stateful_step_count=50, deadline=None,
                             suppress_health_check=[HealthCheck.too_slow])
KVManagerMachine.TestCase.settings = _MACHINE_SETTINGS
TestKVManagerMachine = KVManagerMachine.TestCase


class KVManagerNoCacheMachine(KVManagerMachine):
    """Same with a NoPrefixCache: nothing is ever cached or locked."""

    DISABLE = True


KVManagerNoCacheMachine.TestCase.settings = settings(_MACHINE_SETTINGS, max_examples=25)
TestKVManagerNoCacheMachine = KVManagerNoCacheMachine.TestCase


# --------------------------------------------------------------------------- seeded fuzzer
FUZZ_WEIGHTS = {"admit": 4, "alloc_next": 4, "compute": 5, "cache_unfinished": 1, "abort_step": 0.5,
                "finish": 1.5, "retract": 0.7, "evict": 0.7, "match_random": 1, "flush": 0.1}
FUZZ_SEEDS = 40
FUZZ_STEPS = 400


def run_fuzz(seed: int, disable: bool = False, steps: int = FUZZ_STEPS) -> KVSim:
    rng = random.Random(seed)
    sim, c = KVSim(disable), RandChoice(rng)
    ops, weights = list(FUZZ_WEIGHTS), list(FUZZ_WEIGHTS.values())
    trace = []
    for _ in range(steps):
        op = rng.choices(ops, weights)[0]
        trace.append(op)
        try:
            sim.step(op, c)
            sim.check()
        except AssertionError as e:
            raise AssertionError(f"seed {seed}, step {len(trace)} ({op}); last ops {trace[-8:]}: {e}") from e
    sim.drain()
    return sim


def test_kv_manager_fuzz():
    """Seeded random fuzzer: FUZZ_SEEDS runs of FUZZ_STEPS weighted operations each, with the
    invariants checked after every operation; also asserts the runs reached the interesting
    paths, so a change that makes them unreachable fails here instead of passing silently."""
    events: Counter = Counter()
    for seed in range(FUZZ_SEEDS):
        events += run_fuzz(seed).events
    for name in ("alloc_slots failed", "alloc_slots evicted", "cache_unfinished rewrote a row",
                 "admitted with a cache hit", "flush refused", "readmit"):
        assert events[name] > 0, f"the fuzzer never reached {name!r}: {dict(events)}"


def test_kv_manager_fuzz_no_cache():
    for seed in range(4):
        run_fuzz(1000 + seed, disable=True)


def test_flush_with_a_running_request_on_the_root():
    """Regression: a request with nothing cached points at the root; flush must keep it."""
    kv, allocator, cache, _ = make_kv(16, 4, 32)
    cache.insert([7, 8], allocator.alloc(2))
    r = Req("a", [1, 2, 3], SamplingParams())
    assert kv.admit(r, kv.match_and_lock(r), 3)
    r.kv_len = 3
    assert kv.flush() is True and cache.total_size() == 0
    kv.cache_unfinished(r)
    check_memory_invariants(allocator, cache, [(kv.row(r)[r.cached_len:r.kv_len].long(), r.last_node)])
    kv.release(r)
    check_memory_invariants(allocator, cache)
