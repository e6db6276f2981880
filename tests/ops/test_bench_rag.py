"""benchmarks/bench_rag.py's pure parts: the corpus, the Zipf draws, the prompts and the pool size
(no model is loaded)."""
from __future__ import annotations

from collections import Counter

import numpy as np

from benchmarks.rag_trace import build_corpus, build_prompts, draw_requests, pool_tokens, zipf_weights


def test_corpus_sizes_are_in_range_and_deterministic() -> None:
    docs = build_corpus(200, 1000, 4000, seed=7, vocab=49152)
    assert len(docs) == 200 and all(1000 <= len(d) <= 4000 for d in docs)
    assert all(100 <= t < 49152 - 100 for t in docs[0])
    assert docs == build_corpus(200, 1000, 4000, seed=7, vocab=49152)
    assert docs != build_corpus(200, 1000, 4000, seed=8, vocab=49152)


def test_corpus_from_texts_slices_the_token_stream_in_order() -> None:
    texts = [" ".join(str(i * 100 + j) for j in range(100)) for i in range(50)]  # token ids 0..4999 in order
    docs = build_corpus(3, 10, 40, seed=1, vocab=1000, texts=texts, tokenize=lambda s: [int(w) for w in s.split()])
    lens = [len(d) for d in docs]
    assert all(10 <= n <= 40 for n in lens)
    assert [t for d in docs for t in d] == list(range(sum(lens)))  # consecutive, nothing skipped or repeated


def test_zipf_draws_are_skewed_and_requests_have_one_to_three_distinct_docs() -> None:
    w = zipf_weights(200, 1.1)
    assert abs(w.sum() - 1) < 1e-9 and np.all(np.diff(w) < 0)
    draws = draw_requests(200, 2000, 1.1, seed=0)
    assert draws == draw_requests(200, 2000, 1.1, seed=0)
    assert all(1 <= len(d) <= 3 and len(set(d)) == len(d) and d == sorted(d) for d in draws)
    assert {len(d) for d in draws} == {1, 2, 3}
    counts = Counter(i for d in draws for i in d)
    per_doc = [counts.get(i, 0) for i in range(200)]
    assert max(per_doc) == per_doc[0] > 5 * np.median(per_doc)  # rank 0 is drawn far more than the median doc


def test_prompts_share_the_system_prompt_and_pool_holds_a_request() -> None:
    corpus = build_corpus(20, 100, 200, seed=0, vocab=1000)
    draws = [[0, 3], [0], [2, 5, 9]]
    prompts = build_prompts(corpus, draws, system_len=50, vocab=1000, seed=0)
    assert prompts[0][:50] == prompts[1][:50] == prompts[2][:50]
    assert prompts[0][50:50 + len(corpus[0])] == corpus[0] == prompts[1][50:50 + len(corpus[0])]
    for p, ds in zip(prompts, draws):
        assert 20 <= len(p) - 50 - sum(len(corpus[d]) for d in ds) <= 40  # the question
    assert prompts[0][-20:] != prompts[1][-20:]
    assert pool_tokens(500_000, 0.2, 12_000) == 100_000
    assert pool_tokens(20_000, 0.2, 12_000, chunk=2048) == 14_048
