"""JSON extraction constrained by a JSON schema: the runs of ``json_regex`` (same paragraphs and
examples), the output constrained by ``gen(..., json_schema=SCHEMA)`` instead of a regex."""
from __future__ import annotations

from benchmarks.programs.spec import Workload, variables
from benchmarks.programs.workloads.json_regex import INTRO, extraction_args
from frontend_lang import function, gen

TEXT = {"type": "string", "minLength": 1, "maxLength": 24}
SCHEMA = {"type": "object",
          "properties": {"name": TEXT, "age": {"type": "integer", "minimum": 0, "maximum": 120}, "city": TEXT,
                         "job": TEXT, "hobby": TEXT},
          "required": ["name", "age", "city", "job", "hobby"], "additionalProperties": False}


@function
def json_schema(s, examples: str, paragraph: str, max_tokens: int):
    s += INTRO + examples + f"Paragraph: {paragraph}\nJSON:\n"
    s += gen("json", max_tokens=max_tokens, json_schema=SCHEMA)


def make(n: int, seed: int = 0, *, scale: float = 1.0) -> Workload:
    return Workload("json_schema", json_schema, extraction_args(n, seed, scale), frozenset({"gen", "json_schema"}),
                    variables("json"), description="JSON extraction from a generated paragraph, gen with json_schema=")
