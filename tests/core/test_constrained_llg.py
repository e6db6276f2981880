"""The llguidance grammar backend: ebnf (Lark and GBNF), synchronous validation naming the
field and the unsupported keyword, its lenient mode kept off, schema tightenings, and
jump-forward's splice agreeing with token-by-token acceptance on both backends.

The tiny random Llama (SmolLM2's tokenizer) drives the engine; the state-level checks
need no model at all (only the tokenizer)."""
from __future__ import annotations

import json
import random
import re

import numpy as np
import pytest

from tests.helpers.models import make_engine
from tests.helpers.constrained_cases import SCHEMAS, valid
from radixserve.config import SchedulerConfig
from radixserve.request_builder import verify_sampling
from radixserve.sampling_params import SamplingParams

GBNF = '''root ::= greeting " " name "."
greeting ::= "hello" | "hi"
name ::= [a-z]{1,6}
'''
LARK = 'start: ("yes" | "no") ", " NUM\nNUM: /[0-9]{1,3}/\n'


def check(backend: str, **kw) -> None:
    verify_sampling(SamplingParams(**kw), 100, backend)


def test_ebnf_validation_and_messages():
    check("llguidance", ebnf=GBNF)
    check("llguidance", ebnf=LARK)
    cases = [(dict(ebnf='root ::= foo'), "sampling_params.ebnf: not a valid Lark or GBNF grammar: Rule 'foo' not found"),
             (dict(ebnf="start: missing"), "sampling_params.ebnf: invalid ebnf"),
             (dict(ebnf=5), "sampling_params.ebnf: must be a non-empty string"),
             (dict(regex=r"\p{NoSuchClass}+"), "sampling_params.regex: invalid regex"),
             (dict(regex="(a"), "sampling_params.regex: invalid regular expression"),
             (dict(ebnf=LARK, regex="a"), "sampling_params.ebnf: give only one of")]
    for kw, needle in cases:
        with pytest.raises(ValueError) as e:
            check("llguidance", **kw)
        assert str(e.value).startswith(needle), str(e.value)
    with pytest.raises(ValueError, match=r"^sampling_params\.ebnf: .*needs?.*llguidance"):
        check("outlines", ebnf=GBNF)


@pytest.mark.parametrize("schema,keyword", [
    ({"type": "array", "items": {"type": "integer"}, "contains": {"const": 1}}, "contains"),
    ({"if": {"type": "string"}, "then": {"minLength": 2}}, "if"),
    ({"type": "string", "not": {"pattern": "a"}}, "not"),
    ({"type": "string", "format": "regex"}, "Unknown format: regex"),  # standard, not enforceable
    ({"type": "object", "patternProperties": {"^a": {}}, "propertyNames": {"maxLength": 3}}, "propertyNames"),
    ({"type": "array", "contains": {"const": 2}, "x-guidance": {"lenient": True}}, "contains"),  # cannot switch lenient on
])
def test_unsupported_keyword_is_refused_naming_it(schema, keyword):
    with pytest.raises(ValueError) as e:
        check("llguidance", json_schema=schema)
    msg = str(e.value)
    # llguidance's own refusal, or a rewrite's (constrained/schema/rewrites.py) naming the keyword and path
    assert msg.startswith(("sampling_params.json_schema: unsupported or invalid schema",
                           f"sampling_params.json_schema: '{keyword}' at #")) and keyword in msg, msg


def test_schema_tightenings_keep_outputs_valid():
    from radixserve.constrained.schema.llg_spec import close_objects, tighten

    s = {"type": "object", "properties": {"zip": {"type": "string", "pattern": "[0-9]{5}"},
                                          "tag": {"type": "string", "pattern": "^a"}}, "required": ["zip"],
         "$defs": {"o": {"type": "object", "properties": {"a": {}}}},
         "allOf": [{"properties": {"b": {}}}]}
    t = tighten(s)
    assert t["properties"]["zip"]["pattern"] == "^(?:[0-9]{5})$" and t["properties"]["tag"]["pattern"] == "^a"
    assert "additionalProperties" not in t  # allOf beside the properties: left open
    assert t["$defs"]["o"]["additionalProperties"] is False
    assert "additionalProperties" not in t["allOf"][0]  # closing an allOf branch would contradict the others
    assert close_objects({"type": "object"}) == {"type": "object"}  # json_object: any object
    req_missing = {"type": "object", "properties": {"a": {}}, "required": ["b"]}
    assert "additionalProperties" not in close_objects(req_missing)
    # anyOf branches merge with the node: one is closed only when it lists every name the node requires
    union = {"type": "object", "required": ["a", "b"],
             "anyOf": [{"properties": {"a": {"const": 1}, "b": {}}}, {"properties": {"a": {"const": 2}}}]}
    both, only_a = close_objects(union)["anyOf"]
    assert both["additionalProperties"] is False and "additionalProperties" not in only_a
    assert all("additionalProperties" not in b for b in close_objects(union, in_all_of=True)["anyOf"])


def test_exact_rewrites_of_dependencies_and_byte_format(smol_dir):
    """Property dependencies and ``format: byte`` compile to grammars that accept exactly
    the documents jsonschema accepts (checked on a handful of documents)."""
    import jsonschema
    from llguidance import LLMatcher, LLTokenizer

    from radixserve.constrained.schema.llg_spec import llguidance_source
    from radixserve.constrained.runtime.vocab import find_backend

    tok = _tok(smol_dir)
    llt = LLTokenizer(find_backend(tok).to_str(), eos_token=[tok.eos_token_id])
    cases = [({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "boolean"}},
               "dependencies": {"a": ["b"], "c": []}},
              ['{"a":1,"b":2}', '{"a":1}', '{"b":2}', "{}", '{"c":true}', '{"a":1,"c":true}']),
             ({"type": "object", "properties": {"x": {"type": "string"}, "y": {"type": "string"}},
               "dependentRequired": {"y": ["x"]}}, ['{"x":"1","y":"2"}', '{"y":"2"}', '{"x":"1"}']),
             ({"type": "string", "format": "byte"}, ['"aGk="', '"aGk"', '""', '"aGVsbG8h"', '"a$=="'])]
    for schema, docs in cases:
        grammar = llguidance_source("json", json.dumps(schema), "")
        for doc in docs:
            m = LLMatcher(llt, grammar, log_level=0)
            ids = tok.encode(doc)
            accepted = m.try_consume_tokens(ids) == len(ids) and m.is_accepting()
            cls = jsonschema.Draft202012Validator if "dependentRequired" in schema else jsonschema.Draft7Validator
            ok = cls(schema).is_valid(json.loads(doc))
            if schema.get("format") == "byte":
                import base64
                import binascii
                try:
                    ok = base64.b64decode(json.loads(doc), validate=True) is not None
                except binascii.Error:
                    ok = False
            assert accepted == ok, (schema, doc, accepted, ok)


def _tok(smol_dir):
    from radixserve.tokenizer import load_light_tokenizer

    return load_light_tokenizer(smol_dir)


@pytest.mark.parametrize("backend", ["llguidance", "outlines"])
def test_splice_equals_token_by_token(smol_dir, backend):
    """A jump (``splice``) reaches the state that accepting the same tokens one by one
    reaches: same masks, same forced text, same outcome; the queries change nothing."""
    from radixserve.constrained.runtime.registry import make_backend
    from radixserve.constrained.schema.spec import constraint_of

    tok = _tok(smol_dir)
    eos = (tok.eos_token_id,) if getattr(tok, "eos_token_id", None) is not None else (2,)
    cfg = SchedulerConfig(grammar_backend=backend, json_whitespace_pattern="")
    be = make_backend(tok, 49152, eos, cfg)
    try:
        for spec, text in [({"json_schema": SCHEMAS[7][1]}, '{"status":"pending","code":404}'),
                           ({"regex": r"(yes|no)(, because [a-z ]{1,12})?\."}, "yes, because it is."),
                           ({"choices": ["alpha", "beta", "gamma.delta"]}, "gamma.delta")]:
            c = constraint_of(SamplingParams(**spec), "", backend)
            be.request(c)
            g = None
            while g is None:
                g = be.poll(c)
            assert not isinstance(g, Exception), g
            ids = be.vocab.encode(text)
            for cut in range(1, len(ids)):
                a, b = g.new_state(), g.new_state()
                for t in ids[:cut]:
                    assert a.accept(t) and b.accept(t)
                before = (a.mask().copy(), a.forced())
                rest = ids[cut:]
                assert a.valid_from_prev([ids[cut - 1]] + rest)
                assert np.array_equal(a.mask_from_prev([ids[cut - 1]]), before[0])
                kept, masks = a.masks_along(rest)
                assert kept == rest and len(masks) == len(rest) + 1
                assert np.array_equal(a.mask(), before[0]) and a.forced() == before[1]  # nothing changed
                a.splice([ids[cut - 1]] + rest)
                for t in rest:
                    assert b.accept(t)
                assert np.array_equal(a.mask(), b.mask()) and a.forced() == b.forced()
                assert a.outcome() == b.outcome() == "complete" and a.is_accepting()
                assert np.array_equal(masks[-1], b.mask())
                assert a.mask()[list(be.vocab.eos_ids)].all() and not a.mask(ignore_eos=True)[list(be.vocab.eos_ids)].any()
            z = g.new_state()
            assert not z.accept(be.vocab.eos_ids[0])  # EOS is never a transition, nor allowed at the start
            assert not z.mask()[list(be.vocab.eos_ids)].any()
    finally:
        be.close()


def test_engine_ebnf_and_pathological_regex(tiny_dir):
    eng = make_engine(tiny_dir, grammar_backend="llguidance")
    outs = eng.generate(["a", "b", "c", "d"], [
        {"ebnf": GBNF, "temperature": 1, "seed": 1, "max_new_tokens": 40},
        {"ebnf": LARK, "temperature": 1, "seed": 2, "max_new_tokens": 40},
        {"ebnf": GBNF, "temperature": 0, "max_new_tokens": 40, "n": 1},
        # exponential for a DFA; llguidance's lazy lexer compiles it at once
        {"regex": r"(a|b)*a(a|b){18}c", "temperature": 1, "seed": 3, "max_new_tokens": 60}])
    assert re.fullmatch(r"(hello|hi) [a-z]{1,6}\.", outs[0]["text"]), outs[0]["text"]
    assert re.fullmatch(r"(yes|no), [0-9]{1,3}", outs[1]["text"]), outs[1]["text"]
    assert re.fullmatch(r"(hello|hi) [a-z]{1,6}\.", outs[2]["text"]), outs[2]["text"]
    o = outs[3]
    assert (o["meta_info"]["finish_reason"]["type"] == "length" and re.fullmatch(r"[ab]*", o["text"])) or \
        re.fullmatch(r"(a|b)*a(a|b){18}c", o["text"]), o
    assert all(o["meta_info"]["finish_reason"]["type"] == "stop" for o in outs[:3])
    assert eng.stats()["grammar_backend"] == "llguidance"
    eng.check_invariants()


def test_both_backends_agree_on_outputs(tiny_dir):
    """Outputs written under one backend are accepted, token by token, by the other."""
    from radixserve.constrained.runtime.registry import make_backend
    from radixserve.constrained.schema.spec import constraint_of

    rng = random.Random(5)
    specs = [{"json_schema": SCHEMAS[i][1]} for i in (0, 7, 17, 25)] + [{"regex": r"[0-9]{4}-[0-9]{2}-[0-9]{2}"}]
    engines = {b: make_engine(tiny_dir, grammar_backend=b) for b in ("llguidance", "outlines")}
    for src, other in (("llguidance", "outlines"), ("outlines", "llguidance")):
        eng = engines[src]
        params = [{**sp, "temperature": 1, "seed": rng.randrange(1000), "max_new_tokens": 200} for sp in specs]
        outs = eng.generate(["x"] * len(params), params)
        cfg = SchedulerConfig(grammar_backend=other)
        be = make_backend(eng.tokenizer, eng.runner.vocab_size, eng.scheduler.stops.eos_ids, cfg)
        try:
            for sp, o in zip(specs, outs):
                kind = "json" if "json_schema" in sp else "regex"
                assert valid(kind, sp.get("json_schema") or sp.get("regex"), o["text"]), o["text"]
                c = constraint_of(SamplingParams(**sp), "", other)
                be.request(c)
                g = None
                while g is None:
                    g = be.poll(c)
                gs = g.new_state()
                ids = [t for t in o["output_ids"] if t not in be.vocab.eos_ids]
                assert all(gs.accept(t) for t in ids), (src, o["text"])
                assert gs.is_accepting(), (src, o["text"])
        finally:
            be.close()



def test_scheduler_leaves_the_front_doors_check_to_the_compile(smol_dir):
    """The scheduler's ``validate=False`` source is the front door's grammar; an unchecked bad one
    (a request that skipped the front door) fails that request's compile, naming the problem."""
    from radixserve.constrained.schema.llg_spec import llguidance_source
    from radixserve.constrained.runtime.registry import make_backend
    from radixserve.constrained.schema.spec import constraint_of

    good = json.dumps({"type": "object", "properties": {"at": {"type": "string", "format": "date-time"}}})
    union = json.dumps({"oneOf": [{"type": "object", "properties": {"k": {"const": "a"}}, "required": ["k"]},
                                  {"type": "object", "properties": {"k": {"const": "b"}}, "required": ["k"]}]})
    for s in (good, union):
        assert llguidance_source("json", s, "", False) == llguidance_source("json", s, "", True)
    bad = {"type": "string", "format": "regex"}
    with pytest.raises(ValueError, match="regex"):
        check("llguidance", json_schema=bad)
    tok = _tok(smol_dir)
    be = make_backend(tok, 49152, (tok.eos_token_id,), SchedulerConfig(json_whitespace_pattern=""))
    try:
        c = constraint_of(SamplingParams(json_schema=bad), "", "llguidance", validate=False)
        be.request(c)
        got = None
        while got is None:
            got = be.poll(c)
        assert isinstance(got, ValueError) and "regex" in str(got), got
    finally:
        be.close()
