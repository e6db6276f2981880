"""Repeated string leaves compiled once (``constrained/schema/shared_leaves.py``): the shared schema means
what the schema meant (``jsonschema`` on documents that tell a date from a non-date, a null from a
missing value), the grammar llguidance compiles from it accepts exactly those documents, and
nothing is shared where a ``$ref`` could resolve elsewhere."""
from __future__ import annotations

import copy
import json

import jsonschema
import pytest

from radixserve.constrained.schema import shared_leaves
from radixserve.constrained.schema.llg_spec import close_objects, llguidance_source
from tests.core.test_schema_rewrites import matcher  # noqa: F401  (the fixture)

DATE = {"type": "string", "format": "date", "description": "a day"}
SCHEMA = {
    "type": "object",
    "$defs": {"__rs_leaf0": {"type": "integer"}},  # a name the sharing must not take
    "properties": {
        "start": DATE,
        "end": {"type": ["string", "null"], "format": "date", "instanceOf": "Date"},
        "days": {"type": "array", "items": {"type": "string", "format": "date", "title": "day"}, "maxItems": 2},
        "until": {"type": ["string", "null"], "format": "date"},
        "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
        "alt": {"anyOf": [{"type": "string", "pattern": "^[A-Z]{3}$"}, {"$ref": "#/$defs/__rs_leaf0"}]},
    },
    "required": ["start", "end", "days", "code", "alt"],  # "until" may be missing
    "additionalProperties": False,
}
GOOD = [
    {"start": "2024-02-29", "end": None, "days": [], "code": "ABC", "alt": 3},
    {"start": "2023-12-31", "end": "2024-01-01", "days": ["2000-02-29"], "until": None, "code": "XYZ",
     "alt": "QRS"},  # in the schema's order of properties, as the grammar writes them
]
BAD = [
    {"start": "2023-02-29", "end": None, "days": [], "code": "ABC", "alt": 3},  # not a leap year
    {"start": "2024-01-01", "end": "2024-13-01", "days": [], "code": "ABC", "alt": 3},
    {"start": "2024-01-01", "end": None, "days": ["1900-02-29"], "code": "ABC", "alt": 3},
    {"start": "2024-01-01", "end": None, "days": [], "code": "abc", "alt": 3},
    {"start": "2024-01-01", "end": None, "days": [], "code": "ABC", "alt": "ab"},
    {"start": "2024-01-01", "end": 5, "days": [], "code": "ABC", "alt": 3},
    {"start": "2024-01-01", "end": None, "days": [], "until": "2024-04-31", "code": "ABC", "alt": 3},
]


def _valid(schema: dict, doc: dict) -> bool:
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker()).is_valid(doc)


def test_share_keeps_the_meaning_and_leaves_the_input_alone():
    tight = close_objects(SCHEMA, False, frozenset(), "#", SCHEMA)  # formats written as patterns
    given = copy.deepcopy(tight)
    shared = shared_leaves.share(given, json.dumps(SCHEMA))
    assert given == tight
    # the string date (start, days) and the nullable one (end, until); not the schema's own pattern
    assert len(shared["$defs"]) == 3 and json.dumps(shared).count('"$ref"') == 5
    assert shared["$defs"]["__rs_leaf0"] == {"type": "integer"}
    assert shared["properties"]["code"] == tight["properties"]["code"]
    assert shared["properties"]["start"] == {"$ref": shared["properties"]["start"]["$ref"], "description": "a day"}
    for doc in GOOD + BAD:
        assert _valid(shared, doc) == _valid(SCHEMA, doc), doc
    assert [_valid(SCHEMA, d) for d in GOOD] == [True] * len(GOOD)
    assert [_valid(SCHEMA, d) for d in BAD] == [False] * len(BAD)


def test_shared_grammar_accepts_exactly_the_valid_documents(matcher):  # noqa: F811
    grammar = llguidance_source.__wrapped__("json", json.dumps(SCHEMA), "")
    assert [matcher(grammar, json.dumps(d, separators=(",", ":"))) for d in GOOD] == [True] * len(GOOD)
    assert [matcher(grammar, json.dumps(d, separators=(",", ":"))) for d in BAD] == [False] * len(BAD)


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"a": DATE, "b": {**DATE, "$id": "https://example.com/b"}}},
    {"type": "object", "properties": {"a": DATE, "b": {"type": "string", "format": "time"}}},  # no repeat
    {"type": "object", "properties": {"a": DATE, "b": {**DATE, "maxLength": 12, "enum": ["2024-01-01"]}}},
    {"type": "object", "$defs": [], "properties": {"a": DATE, "b": DATE}},
])
def test_nothing_is_shared_where_it_could_change_a_meaning_or_buys_nothing(schema):
    tight = close_objects(schema, False, frozenset(), "#", schema)
    assert shared_leaves.share(tight, json.dumps(schema)) is tight
    same = {"type": "object", "properties": {"a": DATE, "b": DATE}}  # the control: this one is shared
    tight = close_objects(same, False, frozenset(), "#", same)
    assert shared_leaves.share(tight, json.dumps(same)) is not tight


def test_repeats_reads_the_text():
    assert shared_leaves.repeats('{"a":{"format":"date"},"b":{"format": "date"}}')
    assert not shared_leaves.repeats('{"a":{"format":"date"},"b":{"format":"time"},"c":{"pattern":"date"}}')
    assert not shared_leaves.repeats('{"a":{"format":"uuid"},"b":{"format":"uuid"}}')  # llguidance's own
