"""MMLU-style 5-shot multiple choice: five solved questions (the prefix every run shares), then
a question with options A-D and a ``select`` over the four letters.

The questions are about generated people (``data.world``): each gives a short biography, asks
about one fact (age, city, job, hobby, or an age a few years on) and offers three distractors of
the same kind, so the right answer is known and the text is new to any model.
"""
from __future__ import annotations

import random

from benchmarks.programs.data import HOBBIES, JOBS, person_passage, world
from benchmarks.programs.spec import Workload, scaled, variables
from frontend_lang import function, select

LETTERS = ["A", "B", "C", "D"]
SUBJECT = "reading comprehension of short biographies"


def question(rng: random.Random, w, p) -> tuple[str, list[str], str]:
    """(question, 4 options, the right option) about person ``p``."""
    first = p.name.split()[0]
    kind = rng.randrange(5)
    k = rng.randrange(3, 12)
    q, right, pool = [
        (f"How old is {first}?", str(p.age), [str(a) for a in range(22, 80)]),
        (f"In which city does {first} live?", p.city, [c.name for c in w.cities]),
        (f"What is {first}'s job?", p.job.capitalize(), [j.capitalize() for j in JOBS]),
        (f"Which activity does {first} enjoy in the evenings?", p.hobby.capitalize(), [h.capitalize() for h in HOBBIES]),
        (f"How old will {first} be in {k} years?", str(p.age + k), [str(p.age + k + d) for d in (-2, -1, 1, 2, k)]),
    ][kind]
    options = rng.sample([o for o in dict.fromkeys(pool) if o != right], 3)
    options.insert(rng.randrange(4), right)
    return q, options, right


def format_item(passage: str, q: str, options: list[str], answer: str = "") -> str:
    lines = [passage, f"Question: {q}", *(f"{L}. {o}" for L, o in zip(LETTERS, options))]
    return "\n".join(lines) + "\nAnswer:" + (f" {answer}\n\n" if answer else " ")


@function
def mmlu(s, shots: str, item: str):
    s += shots + item
    s += select("answer", choices=LETTERS)


def make(n: int, seed: int = 0, *, scale: float = 1.0) -> Workload:
    w = world(seed)
    rng = random.Random(f"mmlu-{seed}")
    shots = f"The following are multiple choice questions (with answers) about {SUBJECT}.\n\n"
    order = rng.sample(w.people, len(w.people))
    people = [order[i % len(order)] for i in range(5 + n)]  # 5 for the shots, then one per run
    for p in people[:scaled(5, scale)]:
        q, opts, right = question(rng, w, p)
        shots += format_item(person_passage(p), q, opts, LETTERS[opts.index(right)])
    args, labels = [], []
    for p in people[5:5 + n]:
        q, opts, right = question(rng, w, p)
        args.append({"shots": shots, "item": format_item(person_passage(p), q, opts)})
        labels.append(LETTERS[opts.index(right)])
    return Workload("mmlu", mmlu, args, frozenset({"select"}), variables("answer"),
                    description="5-shot multiple choice over generated biographies; select over A-D",
                    expected=labels)
