"""RAG pipeline: one long system prompt, retrieved documents, JSON-constrained answers.

Every question runs the same program: the system prompt (instructions plus the whole
knowledge-base index) is identical, so the server prefills it once and every later
question reuses its KV cache; only the retrieved passages and the question are new.
The answer is constrained to a JSON schema, so it always parses.

    radixserve serve &                  # the default model on port 30000
    python examples/rag_pipeline.py     # [--url http://127.0.0.1:30000] [--questions 8]
"""
from __future__ import annotations

import argparse
import json
import re
from collections import Counter

from frontend_lang import RuntimeEndpoint, assistant, function, gen, set_default_backend, system, user

DOCUMENTS = [
    "The Eiffel Tower in Paris was completed in 1889 for the World's Fair and is 330 metres tall.",
    "The Great Wall of China stretches over 21,000 kilometres and was built over many dynasties.",
    "Mount Everest, on the border of Nepal and China, is 8,849 metres above sea level.",
    "The Amazon river carries more water than any other river and flows through Brazil and Peru.",
    "The Sahara is the largest hot desert in the world, covering most of North Africa.",
    "Tokyo is the capital of Japan and its metropolitan area has about 37 million people.",
    "The Louvre in Paris is the world's most visited museum and houses the Mona Lisa.",
    "Lake Baikal in Siberia is the deepest lake on Earth, reaching 1,642 metres.",
    "The Pacific Ocean is the largest ocean, covering about a third of the Earth's surface.",
    "Honey bees communicate the direction of flowers to their hive mates with a waggle dance.",
    "Penguins live almost exclusively in the Southern Hemisphere; emperor penguins breed in Antarctica.",
    "The human heart beats about 100,000 times a day and pumps blood through 100,000 km of vessels.",
]

SYSTEM_PROMPT = (
    "You are the question-answering assistant of a small encyclopedia. Answer only from the "
    "passages given with each question. If the passages do not contain the answer, say "
    "\"unknown\". Cite the ids of the passages you used. Keep answers under twenty words.\n\n"
    "The encyclopedia covers these topics:\n"
    + "\n".join(f"[{i}] {d.split(',')[0].split(' is ')[0]}" for i, d in enumerate(DOCUMENTS))
)

ANSWER_SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "maxLength": 120},
        "sources": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": len(DOCUMENTS) - 1},
                    "maxItems": 3},
    },
    "required": ["answer", "sources"],
}

QUESTIONS = [
    "How tall is the Eiffel Tower?", "When was the Eiffel Tower completed?", "How long is the Great Wall of China?",
    "How high is Mount Everest?", "Which river carries the most water?", "What is the largest hot desert?",
    "How many people live in the Tokyo area?", "Which painting is in the Louvre?", "What is the deepest lake?",
    "How much of the Earth does the Pacific cover?", "How do honey bees tell each other where flowers are?",
    "Where do emperor penguins breed?", "How often does a human heart beat in a day?",
    "Which countries does the Amazon flow through?", "Where is Lake Baikal?", "What is the capital of Japan?",
]


def _words(text: str) -> Counter:
    return Counter(w for w in re.findall(r"[a-z0-9]+", text.lower()) if len(w) > 2)


def retrieve(question: str, k: int = 2) -> list[int]:
    """Keyword-overlap retrieval (a stand-in for a vector store)."""
    q = _words(question)
    scores = [sum((q & _words(d)).values()) for d in DOCUMENTS]
    return sorted(range(len(DOCUMENTS)), key=lambda i: -scores[i])[:k]


@function
def rag(s, question: str):
    s += system(SYSTEM_PROMPT)
    passages = "\n".join(f"[{i}] {DOCUMENTS[i]}" for i in retrieve(question))
    s += user(f"Passages:\n{passages}\n\nQuestion: {question}\nReply with JSON.")
    s += assistant(gen("answer", max_tokens=96, json_schema=ANSWER_SCHEMA))


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:30000")
    ap.add_argument("--questions", type=int, default=len(QUESTIONS))
    args = ap.parse_args(argv)
    set_default_backend(RuntimeEndpoint(args.url))
    questions = (QUESTIONS * (1 + args.questions // len(QUESTIONS)))[: args.questions]
    states = rag.run_batch([{"question": q} for q in questions], temperature=0, progress_bar=True)
    results = []
    for q, st in zip(questions, states):
        answer = json.loads(st["answer"])
        meta = st.get_meta_info("answer")
        results.append({"question": q, **answer, "cached_tokens": meta["cached_tokens"],
                        "prompt_tokens": meta["prompt_tokens"]})
        print(f"{q}\n  -> {answer}  (cached {meta['cached_tokens']}/{meta['prompt_tokens']} prompt tokens)")
    return results


if __name__ == "__main__":
    main()
