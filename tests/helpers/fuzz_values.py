"""Value pools of the hand-written fuzz generators (tests/fuzz_cases.py)."""
from __future__ import annotations

import random

# per field kind: values that kind certainly does not take (strict JSON types)
WRONG_VALUES: dict[str, list] = {
    "int": ["5", 1.5, True, [1], {"a": 1}, "NaN"],
    "int_s": ["5", 1.5, True, {"a": 1}, [[1]], ["1"]],  # an int or a per-prompt list of ints
    "num": ["0.5", True, [0.5], {"x": 1}, "inf"],
    "bool": ["true", 1, 0, [True], {"b": 1}, "yes"],
    "bool_s": ["true", 1, {"b": 1}, [[True]], ["no"]],
    "str": [5, 1.5, True, ["a"], {"a": "b"}],
    "str_or_list": [5, True, {"a": 1}, [1, 2], [["a"]]],
    "str_list": ["abc", 5, [1], [None], {"a": "b"}],
    "str_or_dict": [5, True, [1], 1.5],
    "int_list": ["1,2", 5, [1.5], ["a"], [True], {"a": 1}, [[[1]]]],
    "dict": ["x", 5, [1], True],
    "text": [5, True, {"a": 1}, [1.5], [{"a": 1}], [[["a"]]]],
    "params": ["greedy", 5, [1], True],
    "list": ["x", 5, {"a": 1}, True, [5]],
    "tool_choice": [5, "sometimes", {"type": "function"}, ["auto"]],
    "content": [5, True, {"a": 1}, [5]],
    "segments": ["text", 5, {"text": "a"}, [5], [[5]], True, [{"text": 5}], [{"input_ids": "1"}], [{}],
                 [{"text": "a", "input_ids": [1]}], [{"text": "a", "document": "yes"}], [{"text": "a", "x": 1}]],
    "lora": [5, True, {"a": 1}, [1], [[None]], "", [""]],
    "truthy": [True, [1], "x", {"a": 1}, 1],  # an unsupported field set to anything but its default
    "resp_input": [5, True, {"a": 1}, [5], [{"type": "bogus"}], [{"role": "robot", "content": "x"}],
                   [{"type": "web_search_call", "id": "x"}], [{"role": "user"}], [{"type": "function_call"}]],
}

RAW_NUMBERS = ["NaN", "Infinity", "-Infinity", "1e309", "-1e309", "1E400", "1e-320", "-0.0", "0.0",
               "123456789012345678901234567890", "-1", "0", "1.0000000000000002"]
HUGE_NUMBERS = [2**70, -(2**70), 2**63, 2**64 - 1, -(2**63) - 1, 10**100, 1e300, -1e300, 1e-300, 2**31]

UNICODE_TEXTS = ["\u202e\u200b\ufeff", "\U0001F600" * 50, "\x00\x01\x7f", "\ud800", "a\udfffb", "\U0010ffff",
                 "\u03a9\u2248\u00e7\u221a\u222b", "e" + "\u0301" * 200, "\r\n\t", "\ufdfa" * 20, "\ud83d",
                 "\u65e5\u672c\u8a9e", "\ufffe\uffff", "\x1b[31m", "a" * 3000]

BAD_REGEXES = [
    "(a+)+$", "(a|aa)*b", "(x+x+)+y", "([a-z]+)*\\d", "(.*a){20}", "[a-z]{1000}", "(a{1,100}){1,100}",
    "((ab)*|(cd)*)*e", ".{65535}", "(?:[0-9a-f]{8}-){100}", "a{100000}", "\\", "(", "[z-a]", "(?P<n>a)(?P=n)",
    "(?=a)b", "\\1(a)", "a**", "x" * 100000, "(a|b|c|d|e|f|g|h)*" * 50, "[\\s\\S]*", "", "\\p{Lu}+",
    "(?i)abc", "^$", "(((((((((((a)))))))))))" * 20, "[^\\x00-\\x{10FFFF}]", "a{2147483648}",
    "(a{0,65535}){0,65535}", "\\d{1,5}(\\.\\d{1,5}){0,1000}",
]


def _ref_chain(n: int) -> dict:
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(n)}
    defs[f"d{n}"] = {"type": "string"}
    return {"$ref": "#/$defs/d0", "$defs": defs}


BAD_SCHEMAS = [
    {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}},
    {"$ref": "#"}, {"type": "object", "properties": {"c": {"$ref": "#"}}, "required": ["c"]},
    {"type": "object", "properties": {"c": {"$ref": "#"}}}, _ref_chain(500), {"$ref": "#/$defs/missing"},
    {"$ref": "file:///etc/hostname"}, {"type": "string", "minLength": 10**9}, {"type": "array", "minItems": 2**70},
    {"type": "array", "minItems": 5000, "items": {"type": "integer"}}, {"type": "integer", "minimum": 1e308,
                                                                       "maximum": -1e308},
    {"type": "number", "multipleOf": 1e-300}, {"type": "string", "pattern": "(a+)+$"},
    {"enum": list(range(20000))}, {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(2000)},
                                   "required": [f"p{i}" for i in range(2000)]},
    {"anyOf": [{"type": "string", "pattern": f"a{{{i}}}"} for i in range(300)]}, {"type": "bogus"}, {"type": 5},
    [1, 2], "not json {", "true", {"allOf": [{"type": "string"}, {"type": "integer"}]}, {"not": {}},
    {"type": "string", "format": "uuid"}, {"properties": {"a": {"$ref": "#/properties/a"}}, "required": ["a"]},
    {"type": "string", "maxLength": -1}, {"type": "integer", "minimum": 2**70}, {"const": {"a": [1, {"b": None}]}},
    {"$defs": {"x": {"$ref": "#/$defs/x"}}, "$ref": "#/$defs/x"}, {"type": "object", "patternProperties": {
        "(a+)+$": {"type": "string"}}}, {"type": "string", "pattern": "\\"}, {},
]

BAD_EBNF = ["root ::= root", "root ::= 'a' root | root 'b'", "start: start", "root ::= (", "", "x" * 10000,
            "root ::= " + " | ".join(f'"{i}"' for i in range(5000)), 'root ::= "a"{1000000}',
            "start: /(a+)+$/", 'root ::= [^]*', "%import common.WORD\nstart: WORD", "root ::= \"\\ud800\""]


def deep_json(depth: int, rng: random.Random) -> str:
    """``depth`` nested arrays or objects."""
    if rng.random() < 0.5:
        return "[" * depth + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth
