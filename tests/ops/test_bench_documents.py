"""bench_documents' trace (no model run): documents marked, orders of their own, facts planted
where the questions ask for them."""
from __future__ import annotations

import argparse

from benchmarks.bench_documents import build_requests


def test_the_trace(smol_dir):
    from radixserve.tokenizer import load_hf_tokenizer

    tok = load_hf_tokenizer(smol_dir)
    a = argparse.Namespace(docs=10, doc_min=40, doc_max=60, facts=4, requests=12, zipf=1.0, max_docs=5, seed=0,
                           fact_questions=0)
    reqs, _, fact_set = build_requests(a, tok)
    assert fact_set == []
    assert len(reqs) == 12
    orders = set()
    for r in reqs:
        docs = [s for s in r["segments"] if s.get("document")]
        assert 3 <= len(docs) <= 5 and not r["segments"][0].get("document") and not r["segments"][-1].get("document")
        assert r["ids"] == [t for s in r["segments"] for t in s["input_ids"]]
        orders.add(tuple(tuple(s["input_ids"][:3]) for s in docs))
        if r["code"] is not None:  # the fact it asks about is in one of its documents
            assert any(r["code"] in tok.decode(s["input_ids"]) for s in docs)
    assert sum(r["code"] is not None for r in reqs) >= 6 and len(orders) == 12
