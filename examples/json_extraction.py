"""JSON extraction: turn free text into records that validate against a JSON schema.

The schema is compiled into a token-level automaton on the server, so every record
parses and validates; text the schema forces (keys, punctuation) is appended by
jump-forward instead of being sampled token by token.

    radixserve serve &
    python examples/json_extraction.py  # [--url http://127.0.0.1:30000]
"""
from __future__ import annotations

import argparse
import json

from frontend_lang import RuntimeEndpoint, assistant, function, gen, set_default_backend, system, user

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 30},
        "occupation": {"type": "string", "maxLength": 30},
        "skills": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3},
    },
    "required": ["name", "age", "city", "occupation", "skills"],
}

TEXTS = [
    "Maria Lopez is a 29-year-old nurse from Madrid who speaks Spanish and English and loves climbing.",
    "At 45, Tom Becker still runs his bakery in Hamburg; he is known for sourdough and pretzels.",
    "Priya Nair, 34, writes software in Bangalore. She is an expert in Rust and databases.",
    "The pilot, 52-year-old Jean Dupont of Lyon, has flown Airbus jets for twenty years.",
]


@function
def extract(s, text: str):
    s += system("You extract structured data from text. Reply with one JSON object.")
    s += user(f"Extract the person's name, age, city, occupation and up to three skills.\n\nText: {text}")
    s += assistant(gen("record", max_tokens=128, json_schema=PERSON))


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:30000")
    args = ap.parse_args(argv)
    set_default_backend(RuntimeEndpoint(args.url))
    states = extract.run_batch([{"text": t} for t in TEXTS], temperature=0)
    records = []
    for text, st in zip(TEXTS, states):
        record = json.loads(st["record"])
        records.append(record)
        print(f"{text}\n  -> {json.dumps(record)}")
    return records


if __name__ == "__main__":
    main()
