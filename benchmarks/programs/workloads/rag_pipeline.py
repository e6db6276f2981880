"""DSPy-style RAG: retrieve the k=3 passages that share the most words with a question (in
Python, over generated city pages), gen an answer from them, then a self-check ``select``:
is the answer supported by the passages, yes or no."""
from __future__ import annotations

import random
import re

from benchmarks.programs.data import city_passage, world
from benchmarks.programs.spec import Workload, scaled, variables
from frontend_lang import function, gen, select

K = 3
INTRO = ("Answer the question using only the numbered context passages below. Keep the answer short and "
         "name the passage it comes from.\n\nContext:\n")
STOPWORDS = frozenset("a an and are as at by for from has in is it its of on the to was what which who with "
                      "how many does did when where".split())
ASKS = ["Which river flows through {c}?", "Who is the mayor of {c}?", "In which year was {c} founded?",
        "How many people live in {c}?", "Which dish is {c} best known for?",
        "Which city is twinned with {c}?", "What has the economy of {c} depended on?"]


def words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in STOPWORDS}


def retrieve(question: str, corpus: list[str], k: int) -> list[str]:
    """The ``k`` passages sharing the most words with ``question`` (ties: corpus order)."""
    q = words(question)
    ranked = sorted(range(len(corpus)), key=lambda i: (-len(q & words(corpus[i])), i))
    return [corpus[i] for i in ranked[:k]]


@function
def rag_pipeline(s, question: str, corpus: list[str], k: int, answer_tokens: int):
    docs = retrieve(question, corpus, k)
    s += INTRO + "".join(f"[{i}] {d}\n" for i, d in enumerate(docs, 1))
    s += f"\nQuestion: {question}\nAnswer:" + gen("answer", max_tokens=answer_tokens)
    s += "\n\nIs the answer above fully supported by the context passages? Answer yes or no: "
    s += select("supported", ["yes", "no"])


def make(n: int, seed: int = 0, *, scale: float = 1.0) -> Workload:
    w = world(seed)
    corpus = [city_passage(c) for c in w.cities]
    rng = random.Random(f"rag-{seed}")
    args = [{"question": rng.choice(ASKS).format(c=rng.choice(w.cities).name), "corpus": corpus,
             "k": scaled(K, scale), "answer_tokens": scaled(48, scale)} for _ in range(n)]
    return Workload("rag_pipeline", rag_pipeline, args, frozenset({"gen", "select"}),
                    variables("answer", "supported"),
                    description=f"retrieve {K} generated city pages by word overlap, gen an answer, "
                                "select yes/no: is it supported")
