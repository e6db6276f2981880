"""Regexes and JSON schemas for the structured-generation tests and benchmark.

Every pattern is bounded (no unbounded repeats, strings with maxLength, numbers with
bounds), so an output always completes within ``REGEX_TOKENS`` / ``SCHEMA_TOKENS``.
"""
from __future__ import annotations

import json
import re

REGEX_TOKENS = 64
SCHEMA_TOKENS = 160

# (prompt, regex)
REGEXES = [
    ("Today's date (YYYY-MM-DD):", r"[0-9]{4}-[0-9]{2}-[0-9]{2}"),
    ("A date in the 20th or 21st century:", r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"),
    ("The time now (24h):", r"([01][0-9]|2[0-3]):[0-5][0-9]"),
    ("The exact time with seconds:", r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]"),
    ("Meeting time:", r"(1[0-2]|[1-9]):[0-5][0-9] (AM|PM)"),
    ("Contact email:", r"[a-z0-9._]{1,12}@[a-z0-9]{1,10}\.(com|org|net)"),
    ("Server IP address:", r"((25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"),
    ("An integer:", r"-?(0|[1-9][0-9]{0,5})"),
    ("Pi is approximately", r" ?-?[0-9]{1,4}\.[0-9]{1,3}"),
    ("Avogadro's number in scientific notation:", r"[1-9]\.[0-9]{1,3}e[+-]?[0-9]{1,2}"),
    ("Favourite primary colour:", r"(red|green|blue)"),
    ("Best pet:", r" ?(cat|dog|bird|fish)"),
    ("Phone number:", r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}"),
    ("International phone number:", r"\+[1-9][0-9]{0,2} [0-9]{3} [0-9]{3} [0-9]{4}"),
    ("Pattern:", r"((ab|cd)(ef|gh)){1,3}"),
    ("Is water wet?", r" (yes|no)(, because [a-z ]{1,20})?\."),
    ("Country code:", r"[A-Z]{2,4}"),
    ("A short sentence:", r"[A-Z][a-z]{2,8}( [a-z]{2,8}){1,3}\."),
    ("Hex colour of the sky:", r"#[0-9a-f]{6}"),
    ("Request id:", r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}"),
    ("ZIP code:", r"[0-9]{5}(-[0-9]{4})?"),
    ("Price:", r"\$[0-9]{1,4}\.[0-9]{2}"),
    ("Battery level:", r"(100|[1-9]?[0-9])%"),
    ("Latest version:", r"v[0-9]{1,2}\.[0-9]{1,2}\.[0-9]{1,2}"),
    ("True or false: the earth is round.", r" ?(true|false)"),
    ("Config line:", r"[a-z]{1,8}=[0-9]{1,4}(;[a-z]{1,8}=[0-9]{1,4}){0,2}"),
    ("Homepage URL:", r"https://(www\.)?[a-z]{2,10}\.(com|org|io)(/[a-z]{1,8}){0,2}"),
    ("Full name of a famous scientist:", r" ?[A-Z][a-z]{1,10} [A-Z][a-z]{1,10}"),
    ("Five small numbers as a list:", r"\[[0-9]{1,3}(, [0-9]{1,3}){0,4}\]"),
    ("Timestamp:", r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z"),
    ("Extension:", r"\d{3}-\d{4}"),
    ("First day of the week:", r" ?(Mon|Tues|Wednes|Thurs|Fri|Satur|Sun)day"),
    ("The year 1994 in Roman numerals:", r" ?M{0,3}(CM|CD|D?C{0,3})(XC|XL|L?X{0,3})(IX|IV|V?I{0,3})"),
    ("Coordinates:", r"\(-?[0-9]{1,2}\.[0-9]{1,4}, -?[0-9]{1,3}\.[0-9]{1,4}\)"),
]

S = {"type": "string", "maxLength": 12}  # a bounded string
NAME = {"type": "string", "minLength": 1, "maxLength": 15}
AGE = {"type": "integer", "minimum": 0, "maximum": 120}

# (prompt, schema)
SCHEMAS = [
    ("A person as JSON:", {"type": "object", "properties": {"name": NAME, "age": AGE}, "required": ["name", "age"]}),
    ("A book as JSON:", {"type": "object", "properties": {"title": S, "author": S, "year": {"type": "integer", "minimum": 1400, "maximum": 2030}},
                         "required": ["title", "author", "year"]}),
    ("A city as JSON:", {"type": "object", "properties": {"city": S, "country": S, "population": {"type": "integer", "minimum": 0, "maximum": 99999999}},
                         "required": ["city", "country"]}),
    ("A product:", {"type": "object", "properties": {"name": S, "price": {"type": "number", "minimum": 0, "maximum": 10000},
                                                      "in_stock": {"type": "boolean"}}, "required": ["name", "price", "in_stock"]}),
    ("Tags:", {"type": "array", "items": {"type": "string", "maxLength": 8}, "minItems": 1, "maxItems": 3}),
    ("Scores:", {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 100}, "minItems": 2, "maxItems": 4}),
    ("Traffic light colour:", {"type": "string", "enum": ["red", "amber", "green"]}),
    ("Status:", {"type": "object", "properties": {"status": {"enum": ["ok", "error", "pending"]}, "code": {"type": "integer", "minimum": 100, "maximum": 599}},
                 "required": ["status", "code"]}),
    ("Version object:", {"type": "object", "properties": {"api": {"const": "v1"}, "stable": {"type": "boolean"}}, "required": ["api", "stable"]}),
    ("Username:", {"type": "object", "properties": {"username": {"type": "string", "minLength": 3, "maxLength": 8}}, "required": ["username"]}),
    ("Temperature reading:", {"type": "object", "properties": {"celsius": {"type": "number", "minimum": -50, "maximum": 60}},
                              "required": ["celsius"]}),
    ("Probability:", {"type": "number", "minimum": 0, "maximum": 1}),
    ("Positive count:", {"type": "integer", "exclusiveMinimum": 0, "maximum": 1000}),
    ("Negative offset:", {"type": "integer", "minimum": -500, "exclusiveMaximum": 0}),
    ("Optional fields:", {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}, "b": {"type": "boolean"}, "c": S}}),
    ("Mixed required:", {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 9999}, "note": S, "ok": {"type": "boolean"}},
                         "required": ["id"]}),
    ("Nested address:", {"type": "object", "properties": {"name": NAME, "address": {
        "type": "object", "properties": {"street": S, "zip": {"type": "string", "pattern": "[0-9]{5}"}}, "required": ["street", "zip"]}},
        "required": ["name", "address"]}),
    ("A point:", {"type": "object", "properties": {"x": {"type": "integer", "minimum": -100, "maximum": 100},
                                                    "y": {"type": "integer", "minimum": -100, "maximum": 100}}, "required": ["x", "y"]}),
    ("A list of points:", {"type": "array", "items": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9},
                                                                                       "y": {"type": "integer", "minimum": 0, "maximum": 9}},
                                                      "required": ["x", "y"]}, "minItems": 1, "maxItems": 2}),
    ("Either a number or a word:", {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 999}, {"type": "string", "maxLength": 6}]}),
    ("A pet:", {"type": "object", "properties": {"pet": {"anyOf": [
        {"type": "object", "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["kind", "lives"]},
        {"type": "object", "properties": {"kind": {"const": "dog"}, "good": {"type": "boolean"}}, "required": ["kind", "good"]}]}},
        "required": ["pet"]}),
    ("Team ($defs):", {"$defs": {"member": {"type": "object", "properties": {"name": NAME, "role": {"enum": ["dev", "ops", "pm"]}}, "required": ["name", "role"]}},
                       "type": "object", "properties": {"lead": {"$ref": "#/$defs/member"},
                                                         "size": {"type": "integer", "minimum": 1, "maximum": 50}}, "required": ["lead", "size"]}),
    ("Order ($ref array):", {"$defs": {"item": {"type": "object", "properties": {"sku": {"type": "string", "pattern": "[A-Z]{3}-[0-9]{3}"},
                                                                                 "qty": {"type": "integer", "minimum": 1, "maximum": 99}}, "required": ["sku", "qty"]}},
                             "type": "object", "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/item"}, "minItems": 1, "maxItems": 2}},
                             "required": ["items"]}),
    ("Event date:", {"type": "object", "properties": {"event": S, "date": {"type": "string", "format": "date"}}, "required": ["event", "date"]}),
    ("Nullable note:", {"type": "object", "properties": {"note": {"anyOf": [S, {"type": "null"}]}}, "required": ["note"]}),
    ("Flags:", {"type": "object", "properties": {"debug": {"type": "boolean"}, "verbose": {"type": "boolean"}, "level": {"enum": [1, 2, 3]}},
                "required": ["debug", "verbose", "level"]}),
    ("Matrix:", {"type": "array", "items": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 2, "maxItems": 2},
                 "minItems": 2, "maxItems": 2}),
    ("Color in RGB:", {"type": "object", "properties": {"r": {"type": "integer", "minimum": 0, "maximum": 255},
                                                          "g": {"type": "integer", "minimum": 0, "maximum": 255},
                                                          "b": {"type": "integer", "minimum": 0, "maximum": 255}}, "required": ["r", "g", "b"]}),
    ("Answer with a boolean:", {"type": "boolean"}),
    ("Language:", {"enum": ["python", "rust", "go", None]}),
    ("Rating:", {"type": "object", "properties": {"stars": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 5}, "comment": S},
                 "required": ["stars"], "additionalProperties": False}),
    ("Short code:", {"type": "string", "minLength": 2, "maxLength": 4, "description": "two to four characters"}),
    ("Range:", {"type": "object", "properties": {"lo": {"type": "number", "minimum": -1.5, "maximum": 0.5},
                                                  "hi": {"type": "integer", "minimum": 2.5, "exclusiveMaximum": 7.5}}, "required": ["lo", "hi"]}),
]

# schemas for the jump-forward on/off comparison (long forced keys)
JF_SCHEMAS = [s for s in SCHEMAS if s[1].get("type") == "object"][:14]

UNCONSTRAINED = ["Once upon a time", "The capital of France is", "def fibonacci(n):", "My favourite food is"]

# (kind, spec) constraints for the tiny random model's tests (constrained, speculative)
TINY_CASES = [("regex", r"[0-9]{4}-[0-9]{2}-[0-9]{2}"), ("regex", r"(yes|no)(, because [a-z ]{1,12})?\."),
              ("regex", r"((25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])\.){3}[0-9]{1,3}"), ("choices", ["alpha", "beta", "gamma.delta"]),
              ("json_schema", SCHEMAS[0][1]), ("json_schema", SCHEMAS[16][1]), ("json_schema", SCHEMAS[21][1]),
              ("json_schema", SCHEMAS[18][1])]


def valid(kind: str, spec, text: str) -> bool:
    """Does ``text`` fully satisfy the constraint?"""
    if kind == "regex":
        return re.fullmatch(spec, text) is not None
    if kind == "choices":
        return text in spec
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), spec)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True
