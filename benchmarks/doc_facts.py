"""The fact-lookup set of ``bench_documents.py`` (issue 46): enough questions to resolve 2 points.

``--fact-questions`` questions over ``--fact-docs`` short documents (``--fact-doc-min``..``max``
tokens of ShareGPT text, random ids without the wheel), each document holding one planted fact
("The access code for project <Colour> <Name> is <5 digits>.", a distinct name per document).  A
question: the benchmark's chat template and instruction, ``--fact-k`` distinct documents (the one
holding the asked fact and others, each with a fact of its own as a distractor) **in an order of
its own**, then "What is the access code for project <Colour> <Name>?".  Question ``i`` asks
document ``i % fact_docs``, so each document is asked about several times, placed at other
positions.  Scored: the share of greedy answers (``--fact-new`` tokens) that contain the code, and,
teacher forced, the share of the reference configuration's answer tokens that are the top token.
"""
from __future__ import annotations

import argparse
import random
from typing import Any, Callable, Optional

from benchmarks.rag_trace import build_corpus, sharegpt_texts

NAMES = ["Aurora", "Basalt", "Cobalt", "Dahlia", "Ember", "Fjord", "Garnet", "Harbor", "Iris", "Juniper", "Kestrel",
         "Lumen", "Marble", "Nimbus", "Onyx", "Pioneer", "Quartz", "Raven", "Sierra", "Tundra"]
COLOURS = ["Amber", "Blue", "Crimson", "Golden", "Green", "Grey", "Ivory", "Jade", "Silver", "Violet"]


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fact-questions", type=int, default=0,
                   help="questions of the fact-lookup set (0: none; >= 100 resolves 2 points)")
    p.add_argument("--fact-docs", type=int, default=50)
    p.add_argument("--fact-doc-min", type=int, default=150)
    p.add_argument("--fact-doc-max", type=int, default=300)
    p.add_argument("--fact-k", type=int, default=3, help="documents per question")
    p.add_argument("--fact-new", type=int, default=16, help="greedy tokens of an answer")


def fact_name(i: int) -> str:
    return f"{COLOURS[i // len(NAMES) % len(COLOURS)]} {NAMES[i % len(NAMES)]}"


def build_fact_set(a: argparse.Namespace, tok: Any, head: list[int], tail: list[int],
                   encode: Callable[[str], list[int]]) -> list[dict]:
    """The questions: segments (documents marked), plain ids, the code the answer must hold."""
    n = a.fact_docs
    corpus = build_corpus(n, a.fact_doc_min, a.fact_doc_max, a.seed + 11, len(tok), sharegpt_texts(), encode)
    rng = random.Random(a.seed + 13)
    codes = []
    for i, doc in enumerate(corpus):
        code = str(rng.randrange(10000, 99999))
        at = rng.randrange(len(doc) // 4, 3 * len(doc) // 4)
        doc[at:at] = encode(f" The access code for project {fact_name(i)} is {code}. ")
        codes.append(code)
    out = []
    for q in range(a.fact_questions):
        d = q % n
        docs = [d] + rng.sample([j for j in range(n) if j != d], min(a.fact_k, n) - 1)
        rng.shuffle(docs)
        question = encode(f"\n\nQuestion: What is the access code for project {fact_name(d)}?") + tail
        segments = [{"input_ids": head}] + [{"input_ids": corpus[j], "document": True} for j in docs] \
            + [{"input_ids": question}]
        out.append({"segments": segments, "ids": [t for s in segments for t in s["input_ids"]], "code": codes[d]})
    return out


def ask(eng: Any, facts: list[dict], params: dict, marked: bool) -> list[dict]:
    """Every question, one at a time (greedy); the outputs."""
    outs = []
    for f in facts:
        form = {"segments": f["segments"]} if marked else {"input_ids": f["ids"]}
        outs.append(eng.generate(sampling_params=params, **form))
    return outs


def score(facts: list[dict], outs: list[dict]) -> float:
    return sum(f["code"] in o["text"] for f, o in zip(facts, outs)) / max(1, len(facts))


def answer_agreement(eng: Any, items: list[dict], answers: list[list[int]], doc_params: Optional[dict]) -> float:
    """Teacher forced: the share of answer positions whose top token is the reference's next one
    (``doc_params``: the document fields of sampling_params; None: documents unmarked)."""
    hit = total = 0
    for r, ans in zip(items, answers):
        if not ans:
            continue
        start = len(r["ids"])
        sp = {"max_new_tokens": 0, **(doc_params or {})}
        form = {"segments": r["segments"] + [{"input_ids": ans}]} if doc_params is not None else \
            {"input_ids": r["ids"] + ans}
        out = eng.generate(sampling_params=sp, return_logprob=True, logprob_start_len=start, top_logprobs_num=1,
                           **form)
        tops = out["meta_info"]["input_top_logprobs"]  # [j]: the top tokens for ans[j]
        for j in range(len(ans)):
            hit += int(tops[j] is not None and tops[j][0][1] == ans[j])
            total += 1
    return hit / max(1, total)
