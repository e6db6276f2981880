"""Schema rewrites that widen what constrained generation accepts without weakening it
(``constrained/schema/one_of.py``, ``constrained/schema/llg_spec.py``): each rewritten schema's grammar accepts
exactly the documents ``jsonschema`` accepts, on documents chosen to tell the exact meaning from the
weakened one; a rewrite that cannot be proven is a refusal naming the keyword and its path; and the
disjointness prover is sound on random schemas and values."""
from __future__ import annotations

import json
import random

import jsonschema
import pytest

from radixserve.constrained.schema import one_of
from radixserve.constrained.schema.llg_spec import llguidance_source

TAGGED = {"oneOf": [
    {"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "number"}}, "required": ["kind", "r"]},
    {"type": "object", "properties": {"kind": {"const": "square"}, "side": {"type": "number"}},
     "required": ["kind", "side"]},
]}
REFS = {"$defs": {"a": {"type": "object", "properties": {"t": {"enum": ["x", "y"]}}, "required": ["t"]},
                  "b": {"type": "object", "properties": {"t": {"enum": ["z"]}}, "required": ["t"]}},
        "type": "object", "properties": {"item": {"oneOf": [{"$ref": "#/$defs/a"}, {"$ref": "#/$defs/b"}]}},
        "required": ["item"]}
CASES = [
    (TAGGED, ['{"kind":"circle","r":1}', '{"kind":"square","side":2}', '{"kind":"circle","side":2}',
              '{"kind":"oval","r":1}', '{"r":1}']),
    ({"oneOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}]}, ['"a"', "3", "null", "true", "1.5"]),
    ({"oneOf": [{"type": "integer", "maximum": 9}, {"type": "integer", "minimum": 10}]}, ["9", "10", "-4", "123", "1.5", "true"]),
    ({"oneOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
                 "additionalProperties": False},
                {"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"],
                 "additionalProperties": False}]}, ['{"a":1}', '{"b":2}', '{"a":1,"b":2}', "{}"]),
    (REFS, ['{"item":{"t":"x"}}', '{"item":{"t":"z"}}', '{"item":{"t":"w"}}']),
    ({"oneOf": [{"enum": ["red", "green"]}, {"type": "string", "pattern": "^#[0-9a-f]{6}$"}]},
     ['"red"', '"#00ff00"', '"blue"']),
]


@pytest.fixture(scope="module")
def matcher(smol_dir):
    from llguidance import LLMatcher, LLTokenizer

    from radixserve.constrained.runtime.vocab import find_backend
    from radixserve.tokenizer import load_light_tokenizer

    tok = load_light_tokenizer(smol_dir)
    llt = LLTokenizer(find_backend(tok).to_str(), eos_token=[tok.eos_token_id])

    def accepts(grammar: str, doc: str) -> bool:
        m = LLMatcher(llt, grammar, log_level=0)
        ids = tok.encode(doc)
        return m.try_consume_tokens(ids) == len(ids) and m.is_accepting()

    return accepts


@pytest.mark.parametrize("case", range(len(CASES)))
def test_disjoint_one_of_accepts_exactly_the_valid_documents(matcher, case):
    schema, docs = CASES[case]
    grammar = llguidance_source("json", json.dumps(schema), "")
    valid = [jsonschema.Draft202012Validator(schema).is_valid(json.loads(d)) for d in docs]
    assert any(valid) and not all(valid), "each case has valid and invalid documents"
    assert [matcher(grammar, d) for d in docs] == valid


@pytest.mark.parametrize("schema,where", [
    ({"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 3}]}, "at #: branches 0 and 1"),
    ({"type": "object", "properties": {"v": {"oneOf": [{"type": "number"}, {"type": "integer"}]}}},
     "at #/properties/v: branches 0 and 1"),
    ({"oneOf": [{"type": "object", "properties": {"a": {}, "c": {}}},  # nothing required: {"c":1} matches both
                {"type": "object", "properties": {"b": {}, "c": {}}}]}, "branches 0 and 1"),
])
def test_overlapping_one_of_is_refused_naming_path_and_branches(schema, where):
    with pytest.raises(ValueError) as e:
        llguidance_source("json", json.dumps(schema), "")
    msg = str(e.value)
    assert msg.startswith("sampling_params.json_schema: 'oneOf'") and where in msg and "overlap" in msg, msg


def test_open_branches_are_compared_as_generated():
    """Open objects overlap as written ({"a":1,"b":1} matches both), but each branch is generated
    closed, and a closed {"a"} object never holds the other branch's required "b": accepted."""
    a = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    b = {"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"]}
    assert not one_of.disjoint(a, b, {})
    closed = [dict(x, additionalProperties=False) for x in (a, b)]
    assert one_of.first_overlap(closed, [a, b], {}) is None


def _random_schema(rng: random.Random, depth: int = 0) -> dict:
    kinds = ["string", "integer", "number", "boolean", "null"] + (["object"] if depth < 2 else [])
    t = rng.choice(kinds)
    s: dict = {"type": t}
    if t == "integer" and rng.random() < 0.7:
        s.update({rng.choice(["minimum", "exclusiveMinimum"]): rng.randint(-3, 3),
                  rng.choice(["maximum", "exclusiveMaximum"]): rng.randint(-3, 6)})
    if t == "string" and rng.random() < 0.5:
        s["enum"] = rng.sample(["a", "b", "c", "d"], rng.randint(1, 3))
    if t == "string" and rng.random() < 0.3:
        s.update(minLength=rng.randint(0, 2), maxLength=rng.randint(0, 3))
    if t == "object":
        names = rng.sample(["k", "m", "n"], rng.randint(1, 3))
        s["properties"] = {n: _random_schema(rng, depth + 1) for n in names}
        s["required"] = rng.sample(names, rng.randint(0, len(names)))
        if rng.random() < 0.5:
            s["additionalProperties"] = False
    if rng.random() < 0.1:
        s = {"const": rng.choice([None, True, 1, 2.5, "a", "b"])}
    return s


def _random_value(rng: random.Random, depth: int = 0):
    r = rng.random()
    if r < 0.15:
        return None
    if r < 0.25:
        return rng.random() < 0.5
    if r < 0.45:
        return rng.randint(-5, 7)
    if r < 0.55:
        return rng.choice([2.5, -0.5, 3.0])
    if r < 0.75:
        return rng.choice(["", "a", "b", "c", "d", "ab", "abcd"])
    if depth > 1:
        return {}
    return {n: _random_value(rng, depth + 1) for n in rng.sample(["k", "m", "n", "z"], rng.randint(0, 3))}


def test_disjointness_prover_is_sound():
    """Whenever ``disjoint`` says two schemas cannot share a value, no random value (of 300 per
    pair, plus each schema's own const/enum values) validates against both; and it proves many."""
    rng = random.Random(7)
    proven = 0
    for _ in range(300):
        a, b = _random_schema(rng), _random_schema(rng)
        if not one_of.disjoint(a, b, {}):
            continue
        proven += 1
        va, vb = jsonschema.Draft202012Validator(a), jsonschema.Draft202012Validator(b)
        values = [_random_value(rng) for _ in range(300)]
        values += [x for s in (a, b) for x in s.get("enum", [])] + [s["const"] for s in (a, b) if "const" in s]
        for v in values:
            assert not (va.is_valid(v) and vb.is_valid(v)), (a, b, v)
    assert proven > 100


def test_string_discriminators_decided_without_a_validator_agree_with_jsonschema(monkeypatch):
    """``_accepts_any``'s shortcut (type / enum / const on strings) gives jsonschema's answer on
    random plain schemas, malformed ones included (those go to jsonschema)."""
    rng = random.Random(11)
    words = ["a", "b", "ab", "", "1", "true", "null"]
    types_ = ["string", "integer", "number", "null", ["string", "null"], ["integer", "boolean"], "strng", [{}], 3]
    for _ in range(600):
        schema: dict = {"description": "x"} if rng.random() < 0.3 else {}
        if rng.random() < 0.8:
            schema["type"] = rng.choice(types_)
        if rng.random() < 0.7:
            schema["enum"] = rng.sample(words + [1, None, True, 1.0], rng.randint(0, 4)) if rng.random() < 0.95 else "a"
        if rng.random() < 0.3:
            schema["const"] = rng.choice(words + [1, None])
        values = rng.sample(words, rng.randint(1, 3))
        got = one_of._accepts_any(schema, values, {})
        with monkeypatch.context() as m:
            m.setattr(one_of, "_PLAIN", frozenset())  # force the validator
            want = one_of._accepts_any(schema, values, {})
        assert got == want, (schema, values, got, want)


FORMAT_DOCS = {  # format -> (valid strings, invalid strings)
    "uri-reference": (["http://a.b/c?d#e", "../x", "#frag", "//host:80/p", "", "mailto:x@y.z"],
                      ["x y", "http://a:b", 'a"b']),
    "iri-reference": (["/a/b", "c?d"], ["a b"]),
    "json-pointer": (["", "/a", "/a~0b/~1c", "/"], ["a", "/~2", "/a~"]),
    "relative-json-pointer": (["0", "1/a", "2#"], ["-1", "01/a", "/a"]),
    "uri-template": (["http://x/{id}", "/a{/path*}{?q,lang}", "plain"], ["{", "a{b c}", "x}"]),
    "idn-email": (["a@b.com"], ["not an email"]),
    "iri": (["http://x.y/z"], ["no scheme"]),
}


@pytest.mark.parametrize("fmt", sorted(FORMAT_DOCS))
def test_formats_llguidance_lacks_are_enforced(matcher, fmt):
    grammar = llguidance_source("json", json.dumps({"type": "string", "format": fmt}), "")
    good, bad = FORMAT_DOCS[fmt]
    assert [matcher(grammar, json.dumps(s)) for s in good] == [True] * len(good)
    assert [matcher(grammar, json.dumps(s)) for s in bad] == [False] * len(bad)


REWRITES = [  # (schema, documents): each set holds documents the exact and a weakened meaning disagree on
    ({"type": ["string", "integer"], "not": {"type": "string"}}, ['3', '"a"', "1.5"]),
    ({"not": {"type": ["object", "array", "string", "boolean", "null"]}}, ["2.5", "7", '"x"', "{}"]),
    ({"enum": ["a", "b", "c"], "not": {"enum": ["a", "c"]}}, ['"b"', '"a"', '"c"']),
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "not": {"required": ["a"]}},
     ['{"b":1}', '{"a":1}', '{"a":1,"b":2}', "{}"]),
    ({"type": "object", "properties": {"k": {"enum": ["a", "b"]}, "x": {"type": "integer"}}, "required": ["k"],
      "if": {"properties": {"k": {"const": "a"}}}, "then": {"required": ["x"]}, "else": {"properties": {"x": False}}},
     ['{"k":"a","x":1}', '{"k":"a"}', '{"k":"b"}', '{"k":"b","x":1}']),
    ({"type": "object", "properties": {"ab": {"type": "integer"}, "abcd": {"type": "integer"}},
      "propertyNames": {"maxLength": 3}}, ['{"ab":1}', '{"abcd":1}', "{}"]),
    ({"type": "array", "items": {"enum": ["a", "b", "c"]}, "uniqueItems": True, "maxItems": 2},
     ['["a","b"]', '["a","a"]', '["c"]', "[]", '["a","b","c"]']),
    ({"type": "array", "items": {"type": "boolean"}, "uniqueItems": True}, ["[true,false]", "[true,true]", "[]"]),
    ({"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
      "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
      "dependencies": {"a": {"required": ["b"], "properties": {"b": {"minimum": 5}}}}},
     ['{"a":"x","b":7}', '{"a":"x","b":2}', '{"a":"x"}', '{"b":1}', "{}"]),
    ({"type": "object", "properties": {"a": {}, "b": {}, "c": {}}, "dependentSchemas": {"a": {"required": ["c"]}},
      "dependentRequired": {"b": ["a"]}}, ['{"a":1,"c":2}', '{"a":1}', '{"a":1,"b":2,"c":3}', '{"b":2}', "{}"]),
]


@pytest.mark.parametrize("case", range(len(REWRITES)))
def test_rewritten_keywords_accept_exactly_the_valid_documents(matcher, case):
    schema, docs = REWRITES[case]
    grammar = llguidance_source("json", json.dumps(schema), "")
    valid = [jsonschema.validators.validator_for(schema)(schema).is_valid(json.loads(d)) for d in docs]
    assert any(valid) and not all(valid), "each case has valid and invalid documents"
    assert [matcher(grammar, d) for d in docs] == valid


def compile_exact(schema: dict) -> str:
    """The grammar of ``llg_spec.exact`` (the rewrites without the served narrowings)."""
    from llguidance import LLMatcher

    from radixserve.constrained.schema.llg_spec import exact, json_options

    grammar = LLMatcher.grammar_from_json_schema(json.dumps(exact(schema)), overrides=json_options(""))
    err = LLMatcher.validate_grammar(grammar)
    if err:
        raise ValueError(err)
    return grammar


EXACT_ONLY = [  # rewritten exactly in both modes
    ({"type": "string", "not": {"const": "ab"}}, ['"ab"', '"a"', '""', '"abc"', '"b"', '"a\\nb"']),
    ({"type": "object", "properties": {"k": {"type": "string"}, "n": {"type": "integer"}},
      "if": {"properties": {"k": {"const": "a"}}, "required": ["k"]}, "then": {"required": ["n"]},
      "else": {"properties": {"n": False}}},
     ['{"k":"a","n":1}', '{"k":"a"}', '{"k":"b"}', '{"k":"b","n":1}', "{}", '{"n":2}']),
    ({"type": "object", "properties": {"a": {}, "b": {}}, "not": {"required": ["a", "b"]}},
     ['{"a":1}', '{"b":1}', '{"a":1,"b":2}', "{}"]),
]


@pytest.mark.parametrize("case", range(len(EXACT_ONLY)))
def test_exact_rewrites_in_exact_mode(matcher, case):
    schema, docs = EXACT_ONLY[case]
    grammar = compile_exact(schema)
    valid = [jsonschema.Draft202012Validator(schema).is_valid(json.loads(d)) for d in docs]
    assert any(valid) and not all(valid)
    assert [matcher(grammar, d) for d in docs] == valid


NARROWED = [  # served only: a narrower meaning, never a wider one (valid, producible, invalid documents)
    ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, ['["a"]', "[]"], ['["a","b"]'],
     ['["a","a"]']),
    ({"type": "object", "properties": {"ab": {"type": "integer"}}, "additionalProperties": {"type": "integer"},
      "propertyNames": {"maxLength": 2}}, ['{"ab":1}'], ['{"cd":2}'], ['{"abc":1}']),
    ({"not": {"type": "integer"}}, ['"x"', "null"], ["1.5"], ["3"]),
]


@pytest.mark.parametrize("case", range(len(NARROWED)))
def test_served_narrowings_never_admit_an_invalid_document(matcher, case):
    schema, producible, unproducible_valid, invalid = NARROWED[case]
    grammar = llguidance_source("json", json.dumps(schema), "")
    check = jsonschema.Draft202012Validator(schema)
    assert all(check.is_valid(json.loads(d)) for d in producible + unproducible_valid)
    assert not any(check.is_valid(json.loads(d)) for d in invalid)
    assert [matcher(grammar, d) for d in producible] == [True] * len(producible)
    assert not any(matcher(grammar, d) for d in unproducible_valid + invalid)
    with pytest.raises(ValueError):  # and refused where the meaning must be exact
        compile_exact(schema)


@pytest.mark.parametrize("schema,needle", [
    ({"type": "string", "not": {"pattern": "a"}}, "'not' at #"),
    ({"not": {"type": "integer"}}, "'not' at #: a number that is not an integer"),
    ({"type": "object", "properties": {"o": {"type": "object", "if": {"properties": {"a": {"const": 1}, "b": {"const": 2}}},
                                             "then": {}}}}, "'if' at #/properties/o"),
    ({"type": "object", "additionalProperties": {"type": "integer"}, "propertyNames": {"pattern": "^a"}},
     "'propertyNames' at #: on an object that allows properties it does not list"),
    ({"type": "object", "properties": {"long": {}}, "required": ["long"], "propertyNames": {"maxLength": 2},
      "additionalProperties": False},
     "required property 'long'"),
    ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, "'uniqueItems' at #"),
    ({"type": "array", "items": {"enum": list(range(6))}, "uniqueItems": True, "minItems": 2},
     "arrays of distinct items"),
])
def test_unrewritable_keywords_are_refused_naming_keyword_and_path(schema, needle):
    with pytest.raises(ValueError) as e:
        compile_exact(schema)
    assert needle in str(e.value), str(e.value)


@pytest.mark.parametrize("schema,needle", [
    ({"type": "object", "properties": {"x": {"type": "array", "contains": {"const": 1}}}},
     'Unimplemented keys: ["contains"] (at #/properties/x)'),
    ({"type": "object", "properties": {"d": {"type": "string", "format": "regex"}}}, "Unknown format: regex (at #/properties/d)"),
])
def test_backend_refusals_name_the_path(schema, needle):
    with pytest.raises(ValueError) as e:
        llguidance_source("json", json.dumps(schema), "")
    assert needle in str(e.value), str(e.value)
