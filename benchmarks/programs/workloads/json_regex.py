"""JSON extraction constrained by a regex: a paragraph about a generated person (and their city,
whose numbers are distractors), two solved examples (the shared prefix), then ``gen`` with
``regex=`` that fixes the JSON's layout and bounds every field.  ``json_schema`` asks for the
same fields through a JSON schema; ``extraction_args`` builds both workloads' runs."""
from __future__ import annotations

import json
import random

from benchmarks.programs.data import person_passage, world
from benchmarks.programs.spec import Workload, scaled, variables
from frontend_lang import function, gen

INTRO = "Extract the details of the person described in each paragraph as JSON.\n\n"
REGEX = (r'\{\n  "name": "[A-Z][a-z]{1,12} [A-Z][a-z]{1,12}",\n  "age": [0-9]{1,3},\n'
         r'  "city": "[A-Z][a-z]{1,14}",\n  "job": "[a-z ]{1,20}",\n  "hobby": "[a-z ]{1,20}"\n\}')


def paragraph(w, p) -> str:
    c = next(c for c in w.cities if c.name == p.city)
    return (f"{person_passage(p)} {c.name} lies on {c.river}, has {c.population:,} inhabitants and "
            f"was founded in {c.founded}.")


def record(p) -> str:
    return json.dumps({"name": p.name, "age": p.age, "city": p.city, "job": p.job, "hobby": p.hobby}, indent=2)


def extraction_args(n: int, seed: int, scale: float) -> list[dict]:
    """One run per person: the shared examples, the paragraph, the token budget."""
    w = world(seed)
    people = random.Random(f"json-{seed}").sample(w.people, len(w.people))
    shots = people[len(people) - scaled(2, scale, least=0):]  # never a run's person
    examples = "".join(f"Paragraph: {paragraph(w, p)}\nJSON:\n{record(p)}\n\n" for p in shots)
    return [{"examples": examples, "paragraph": paragraph(w, people[i % (len(people) - 2)]),
             "max_tokens": scaled(96, scale)} for i in range(n)]


@function
def json_regex(s, examples: str, paragraph: str, max_tokens: int):
    s += INTRO + examples + f"Paragraph: {paragraph}\nJSON:\n"
    s += gen("json", max_tokens=max_tokens, regex=REGEX)


def make(n: int, seed: int = 0, *, scale: float = 1.0) -> Workload:
    return Workload("json_regex", json_regex, extraction_args(n, seed, scale), frozenset({"gen", "regex"}),
                    variables("json"), description="JSON extraction from a generated paragraph, gen with regex=")
