"""The JSON-Schema-Test-Suite subset in ``tests/data/json_schema_test_suite`` (draft 2020-12, MIT,
its LICENSE and commit beside it): for every schema the llguidance backend accepts, exactly the
valid instances are producible, in the exact mode (the rewrites alone) and as served (with the
narrowings: a valid instance outside them may be unproducible, an invalid one never producible).
The whole suite: ``benchmarks/json_schema_test_suite.py``."""
from __future__ import annotations

import os

from benchmarks.json_schema_test_suite import run

SUITE = os.path.join(os.path.dirname(__file__), "..", "data", "json_schema_test_suite")
KEYWORDS = ["oneOf", "not", "if-then-else", "propertyNames", "uniqueItems", "dependentRequired", "const", "enum",
            "anyOf", "allOf"]
FORMATS = ["format-uri-reference", "format-json-pointer", "format-relative-json-pointer", "format-uri-template",
           "format-date", "format-time", "format-hostname"]


def test_exact_mode_produces_exactly_the_valid_instances(smol_dir):
    rows = run(SUITE, KEYWORDS, "exact")
    assert set(rows) == set(KEYWORDS)
    assert sum(r["accepted"] for r in rows.values()) >= 40
    for kw, r in rows.items():
        assert not r["failures"], (kw, r["failures"])
        named = ("' at #", "Unimplemented keys", "Unknown format", "Unsatisfiable schema")
        assert all(any(x in m for x in named) for m in r["refusals"]), (kw, r["refusals"])  # says what it refuses


def test_served_formats_never_produce_an_invalid_string(smol_dir):
    rows = run(SUITE, FORMATS, "served")
    for kw, r in rows.items():
        assert r["accepted"] and r["rejected"] == r["invalid"], (kw, [f for f in r["failures"] if "invalid" in f])
        assert r["producible"] > 0, kw  # narrower, not empty
