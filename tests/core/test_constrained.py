"""Structured generation: regex / JSON schema / choices constraints, jump-forward decoding,
compile timeouts, and their interplay with batching and memory pressure.

The tiny random Llama (SmolLM2's tokenizer) checks the mechanics quickly: a random model
is the harshest user of a grammar, since only the mask keeps it in line.  The real SmolLM2
(``slow``) runs every case of tests/constrained_cases.py at temperature 0 and 1.
"""
from __future__ import annotations

import dataclasses
import json
import random
import re
import time

import pytest

from tests.helpers.models import make_engine
from tests.helpers.constrained_cases import (JF_SCHEMAS, REGEX_TOKENS, REGEXES, SCHEMA_TOKENS, SCHEMAS, TINY_CASES, UNCONSTRAINED,
                                             valid)
from radixserve.constrained.schema.json_schema import int_regex, number_regex
from radixserve.detokenizer.incremental import trim_stop

PATHOLOGICAL = r"(a|b)*a(a|b){18}"  # the classic exponential DFA (for outlines-core's automaton)
BACKENDS = ("llguidance", "outlines")


def set_jump_forward(eng, on: bool) -> None:
    def put(sched) -> None:
        sched.cfg = dataclasses.replace(sched.cfg, enable_jump_forward=on)

    eng.run_on_driver(put)


def text_of(eng, req) -> str:
    """The output text of a request driven through ``run_all``, as ``generate`` returns it."""
    return trim_stop(eng.tokenizer.decode(req.output_ids, skip_special_tokens=True), req.finish_reason)


def run_all(eng, prompts, params, check_every_step=False, input_ids=None):
    """Add (text ``prompts`` or ``input_ids``), then step to completion on the engine's driver
    thread (which owns the scheduler); returns the requests."""
    reqs, _ = eng.make_requests(prompts, params, input_ids, False, -1, 0)

    def drive(sched) -> None:
        for r in reqs:
            sched.add_request(r)
        steps = 0
        while sched.has_work():
            sched.step()
            if check_every_step:
                eng.check_invariants()
            steps += 1
            assert steps < 20000
        eng.check_invariants()

    eng.run_on_driver(drive)
    return reqs


# ---------------------------------------------------------------------- no model
@pytest.mark.parametrize("backend", BACKENDS)
def test_invalid_constraints_raise_value_error(tiny_dir, backend):
    from radixserve.request_builder import verify_sampling
    from radixserve.sampling_params import SamplingParams

    cases = {
        "regex": ("(a", "missing )"), "json_schema": ("{bad", "invalid JSON"),
    }
    for field, (value, needle) in cases.items():
        with pytest.raises(ValueError, match=re.escape(needle)) as e:
            verify_sampling(SamplingParams(**{field: value}), 100, backend)
        assert f"sampling_params.{field}" in str(e.value)
    bad = [dict(regex="(?=a)b"), dict(regex=r"(a)\1"), dict(json_schema={"type": "foo"}),
           dict(json_schema={"type": "array", "contains": {}}),
           dict(json_schema={"type": "integer", "minimum": 5, "maximum": 1}), dict(json_schema={"not": {}}),
           dict(json_schema={"type": "string", "format": "regex"}), dict(json_schema=[1]), dict(choices=[]),
           dict(choices="abc"), dict(regex="a", choices=["a"]), dict(regex=5), dict(ebnf=""), dict(ebnf="start: x")]
    if backend == "outlines":  # llguidance enforces multipleOf; outlines-core would ignore it
        # (llguidance serves uniqueItems over unbounded items as at most one item: docs/STRUCTURED_OUTPUT.md)
        bad += [dict(json_schema={"type": "number", "multipleOf": 2}), dict(ebnf='start: "a"'),
                dict(json_schema={"type": "array", "uniqueItems": True})]
    bad.append(dict(json_schema={"oneOf": [{"type": "integer"}, {"type": "number"}]}))  # overlapping: never anyOf
    for kw in bad:
        with pytest.raises(ValueError, match="sampling_params"):
            verify_sampling(SamplingParams(**kw), 100, backend)
    eng = make_engine(tiny_dir, grammar_backend=backend)
    with pytest.raises(ValueError, match="unsupported or invalid schema: (Unsupported|Invalid) type: foo"):
        eng.generate("x", {"json_schema": {"type": "foo"}})
    assert eng.run_on_driver(lambda s: s.grammars.backend) is None  # nothing compiled, nothing started


def test_vocabulary_bytes_match_the_tokenizer(smol_dir):
    from transformers import AutoTokenizer

    from radixserve.constrained.runtime.vocab import TokenVocab
    from radixserve.tokenizer import load_light_tokenizer

    tok = AutoTokenizer.from_pretrained(smol_dir)
    v = TokenVocab.from_tokenizer(tok, len(tok), (tok.eos_token_id,))
    assert v.token_bytes == TokenVocab.from_tokenizer(load_light_tokenizer(smol_dir), len(tok), (tok.eos_token_id,)).token_bytes
    assert v.token_bytes[tok.eos_token_id] is None and v.token_bytes[tok.encode(" hello")[0]] == b" hello"
    rng = random.Random(0)
    normal = [i for i, b in enumerate(v.token_bytes) if b is not None]
    for _ in range(500):  # byte-level tokens, partial UTF-8 included, decode exactly
        ids = [rng.choice(normal) for _ in range(rng.randrange(1, 6))]
        assert v.text_bytes(ids).decode("utf-8", "replace") == tok.decode(ids)
    assert v.text_bytes(tok.encode("héllo wörld ✓")) == "héllo wörld ✓".encode()


def test_outlines_refuses_an_empty_subschema():
    """outlines-core's own regex for ``{}`` inside an object accepted text that is not JSON
    (JSONSchemaBench, Snowplow sp_141): refused, naming it, rather than weakened."""
    from radixserve.constrained.schema.json_schema import schema_to_regex

    s = {"type": "object", "properties": {"attributes": {"description": "anything"}, "name": {"type": "string"}}}
    with pytest.raises(ValueError, match=r"empty subschema .*\(at /properties/attributes\)"):
        schema_to_regex(json.dumps(s), "")
    schema_to_regex(json.dumps({"type": "object", "properties": {"name": {"type": "string"}}}), "")


def test_numeric_range_regexes_are_exact():
    for lo, hi in [(0, 120), (10, None), (-5, 5), (-100, -3), (None, 7), (None, -7), (1400, 2030), (0, 0)]:
        rx = re.compile(int_regex(lo, hi))
        for v in range(-700, 3000):
            assert bool(rx.fullmatch(str(v))) == ((lo is None or v >= lo) and (hi is None or v <= hi)), (lo, hi, v)
        assert not any(rx.fullmatch(s) for s in ("01", "-0", "+1", "1.0", ""))
    rng = random.Random(1)
    for lo, hi, elo, ehi in [(0, 1, False, False), (0, 5, True, True), (-1.5, 0.5, False, False), (-50, 60, False, False)]:
        rx = re.compile(number_regex(lo, hi, elo, ehi))
        hits = 0
        for _ in range(5000):
            s = rng.choice(["", "-"]) + str(rng.randrange(0, 70)) + rng.choice(["", f".{rng.randrange(0, 1000)}"])
            if rx.fullmatch(s):
                hits += 1
                x = float(s)
                assert (x > lo if elo else x >= lo) and (x < hi if ehi else x <= hi), (lo, hi, s)
        assert hits > 0


# ---------------------------------------------------------------------- tiny random model
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("jump", [True, False])
@pytest.mark.parametrize("backend", BACKENDS)
def test_tiny_mixed_batch(tiny_dir, temperature, jump, backend):
    eng = make_engine(tiny_dir, enable_jump_forward=jump, chunked_prefill_size=16, grammar_backend=backend)
    prompts, params, kinds = [], [], []
    rng = random.Random(2)
    for i, (kind, spec) in enumerate(TINY_CASES * 2):
        prompts.append(" ".join(rng.choice(["the", "a", "JSON", "date", "list"]) for _ in range(rng.randrange(1, 30))))
        params.append({kind: spec, "max_new_tokens": 2 * SCHEMA_TOKENS, "temperature": temperature, "seed": i,
                       "top_p": 0.9 if i % 3 == 0 else 1.0, "top_k": 20 if i % 3 == 1 else -1,
                       "min_p": 0.05 if i % 3 == 2 else 0.0, "repetition_penalty": 1.3 if i % 4 == 0 else 1.0,
                       "frequency_penalty": 0.5 if i % 4 == 1 else 0.0})
        kinds.append((kind, spec))
    for i in range(4):  # unconstrained neighbours
        prompts.append(f"free text {i}")
        params.append({"max_new_tokens": 24, "temperature": temperature, "seed": 100 + i})
        kinds.append(None)
    reqs = run_all(eng, prompts, params, check_every_step=True)
    for r, k in zip(reqs, kinds):
        text = text_of(eng, r)
        if k is None:
            assert r.finish_reason["type"] == "length" and len(r.output_ids) == 24
            continue
        assert r.finish_reason["type"] == "stop", (k, text, r.finish_reason)
        assert valid(k[0] if k[0] != "json_schema" else "json", k[1], text), (k, text)
    stats = eng.stats()
    assert (stats["grammar_jumps"] > 0) == jump
    assert stats["protected_size"] == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_tiny_sampling_options_and_edge_cases(tiny_dir, backend):
    eng = make_engine(tiny_dir, grammar_backend=backend)
    rx = r"[a-c]{2,5}"
    # ignore_eos: the pattern completes at 5 letters and the request stops there
    o = eng.generate("x", {"regex": r"[a-c]{5}", "ignore_eos": True, "max_new_tokens": 50, "temperature": 1, "seed": 1})
    assert re.fullmatch(r"[a-c]{5}", o["text"]) and o["meta_info"]["finish_reason"] == {"type": "stop", "matched": None}
    # min_new_tokens larger than the pattern: the grammar wins, the output still matches
    o = eng.generate("x", {"regex": "(yes|no)", "min_new_tokens": 10, "max_new_tokens": 20, "temperature": 0})
    assert o["text"] in ("yes", "no")
    # stop strings and stop token ids still apply (the output is then a prefix of a match)
    o = eng.generate("x", {"regex": r"abc(def)?", "stop": "c", "max_new_tokens": 20, "temperature": 0})
    assert o["text"] == "ab" and o["meta_info"]["finish_reason"]["matched"] == "c"
    # max_new_tokens cuts a constrained output: finish_reason length, the text a valid prefix
    o = eng.generate("x", {"regex": r"[0-9]{30}", "max_new_tokens": 4, "temperature": 1, "seed": 3})
    assert o["meta_info"]["finish_reason"]["type"] == "length" and re.fullmatch(r"[0-9]*", o["text"])
    # logprobs with a grammar: one logprob per output token (jump-forward stays off for them)
    o = eng.generate("x", {"json_schema": SCHEMAS[0][1], "max_new_tokens": SCHEMA_TOKENS, "temperature": 0}, return_logprob=True)
    assert valid("json", SCHEMAS[0][1], o["text"])
    assert [t[1] for t in o["meta_info"]["output_token_logprobs"]] == o["output_ids"]
    # n > 1 shares one compilation
    outs = eng.generate("x", {"regex": rx, "n": 3, "temperature": 1, "seed": 5, "max_new_tokens": 10})
    assert all(re.fullmatch(rx, o["text"]) for o in outs)
    # a literal pattern is entirely forced: jump-forward writes it in one go
    o = eng.generate("x", {"regex": "The quick brown fox jumps over the lazy dog", "max_new_tokens": 30, "temperature": 1})
    assert o["text"] == "The quick brown fox jumps over the lazy dog"
    # streaming a constrained request
    chunks = list(eng.generate_stream("x", {"choices": ["first option", "second option"], "temperature": 0}))
    assert chunks[-1]["text"] in ("first option", "second option")
    eng.check_invariants()


def test_compile_timeout_fails_only_its_request(tiny_dir):
    """outlines-core compiles ahead of time, in killable processes (llguidance compiles in
    about a millisecond, its parser limits bounding the work: test_constrained_llg.py)."""
    eng = make_engine(tiny_dir, grammar_compile_timeout=2.0, grammar_backend="outlines")
    eng.generate("warm", {"regex": "(a|b)", "max_new_tokens": 2})  # start the compile process
    prompts = ["slow", "free one", "free two", "fast"]
    params = [{"regex": PATHOLOGICAL, "max_new_tokens": 30}, {"max_new_tokens": 12, "ignore_eos": True},
              {"max_new_tokens": 12, "ignore_eos": True}, {"regex": "[0-9]{3}", "max_new_tokens": 8}]
    reqs, _ = eng.make_requests(prompts, params, None, False, -1, 0)

    def drive(sched) -> tuple[int, float]:  # on the engine's driver thread, which owns the scheduler
        t0 = time.monotonic()
        for r in reqs:
            sched.add_request(r)
        tokens_while_compiling, slowest_step = 0, 0.0
        while sched.has_work():
            t = time.monotonic()
            sched.step()
            if not reqs[0].finished:
                slowest_step = max(slowest_step, time.monotonic() - t)
                tokens_while_compiling = len(reqs[1].output_ids) + len(reqs[2].output_ids)
            assert time.monotonic() - t0 < 120
        return tokens_while_compiling, slowest_step

    tokens_while_compiling, slowest_step = eng.run_on_driver(drive)
    slow, a, b, fast = reqs
    assert slow.finish_reason["type"] == "abort" and "timed out after 2 s" in slow.finish_reason["message"]
    assert tokens_while_compiling > 0 and slowest_step < 0.5  # the batch ran on while the pattern compiled
    assert len(a.output_ids) == len(b.output_ids) == 12
    assert fast.finish_reason["type"] == "stop" and re.fullmatch("[0-9]{3}", text_of(eng, fast))
    # the pool recovers; the timeout is cached, so the same pattern fails at once
    o = eng.generate("again", {"regex": "(x|y)z", "max_new_tokens": 5})
    assert o["text"] in ("xz", "yz")
    t1 = time.monotonic()
    o = eng.generate("again", {"regex": PATHOLOGICAL, "max_new_tokens": 5})
    assert "timed out" in o["meta_info"]["finish_reason"]["message"] and time.monotonic() - t1 < 1.0
    eng.check_invariants()


def test_abort_while_compiling(tiny_dir):
    eng = make_engine(tiny_dir, grammar_compile_timeout=3.0, grammar_backend="outlines")
    reqs, _ = eng.make_requests(["p"], {"regex": PATHOLOGICAL + "c"}, None, False, -1, 0)

    def drive(sched) -> None:  # on the engine's driver thread, which owns the scheduler
        sched.add_request(reqs[0])
        sched.step()
        assert sched.abort(reqs[0].rid, "client gone") is reqs[0]
        assert reqs[0].finish_reason == {"type": "abort", "message": "client gone"} and not sched.has_work()

    eng.run_on_driver(drive)


def test_budget_with_grammars_and_jump_forward(tiny_dir):
    """Constrained requests under a KV budget that forces retraction: same outputs as with
    plenty of memory, invariants after every step, nothing leaked."""
    rng = random.Random(4)
    prompts, params = [], []
    for i in range(24):
        prompts.append([rng.randrange(100, 40000) for _ in range(rng.randrange(5, 40))])
        kind, spec = TINY_CASES[i % len(TINY_CASES)]
        params.append({kind: spec, "max_new_tokens": 2 * SCHEMA_TOKENS, "temperature": 0} if i % 3 else
                      {"max_new_tokens": rng.randrange(40, 90), "temperature": 0, "ignore_eos": True})
    solo = make_engine(tiny_dir, max_total_tokens=8192)
    ref = [solo.generate(input_ids=p, sampling_params=sp)["output_ids"] for p, sp in zip(prompts, params)]
    eng = make_engine(tiny_dir, max_total_tokens=400, chunked_prefill_size=32, new_token_ratio=0.05)
    reqs = run_all(eng, None, params, check_every_step=True, input_ids=prompts)
    assert [r.output_ids for r in reqs] == ref
    assert eng.stats()["retractions"] > 0 and eng.stats()["grammar_jumps"] > 0

    def check_kv(sched) -> None:
        s = sched.kv.stats()
        assert s["protected_size"] == 0 and s["free_slots"] + s["evictable_size"] == sched.kv.capacity

    eng.run_on_driver(check_kv)


# ---------------------------------------------------------------------- SmolLM2
_SMOL: dict = {}


@pytest.fixture(scope="module")
def smol_engines(smol_dir):
    """One SmolLM2 engine per grammar backend, made on first use."""
    def get(backend: str):
        if backend not in _SMOL:
            _SMOL[backend] = make_engine(smol_dir, max_total_tokens=30000, grammar_backend=backend)
        return _SMOL[backend]

    yield get
    _SMOL.clear()


def _smol_batch(temperature: float):
    prompts, params, kinds = [], [], []
    for i, (p, rx) in enumerate(REGEXES):
        prompts.append(p)
        params.append({"regex": rx, "max_new_tokens": REGEX_TOKENS, "temperature": temperature, "seed": i})
        kinds.append(("regex", rx))
    for i, (p, schema) in enumerate(SCHEMAS):
        prompts.append(p)
        spec = json.dumps(schema) if i % 2 else schema  # a JSON string or an object
        params.append({"json_schema": spec, "max_new_tokens": SCHEMA_TOKENS, "temperature": temperature, "seed": 100 + i,
                       "top_p": 0.95 if i % 4 == 1 else 1.0, "min_p": 0.02 if i % 4 == 2 else 0.0,
                       "presence_penalty": 0.3 if i % 4 == 3 else 0.0})
        kinds.append(("json", schema))
    for p in ("Pick a fruit:", "Pick a planet:"):
        prompts.append(p)
        params.append({"choices": ["apple", "banana", "cherry"] if "fruit" in p else ["Mars", "Venus", "Jupiter"],
                       "temperature": temperature, "max_new_tokens": 8})
        kinds.append(("choices", params[-1]["choices"]))
    for p in UNCONSTRAINED:
        prompts.append(p)
        params.append({"max_new_tokens": 32, "temperature": temperature, "seed": 7})
        kinds.append(None)
    return prompts, params, kinds


@pytest.mark.slow
@pytest.mark.parametrize("backend,temperature", [("llguidance", 0.0), ("llguidance", 1.0)])  # outlines: bench_structured
def test_smollm2_regexes_and_schemas(smol_engines, backend, temperature):
    smol_engine = smol_engines(backend)
    assert len(REGEXES) >= 30 and len(SCHEMAS) >= 30
    prompts, params, kinds = _smol_batch(temperature)
    outs = smol_engine.generate(prompts, params)
    bad = []
    for o, k, p in zip(outs, kinds, prompts):
        if k is None:
            assert o["meta_info"]["completion_tokens"] > 0
            continue
        if not valid(k[0], k[1], o["text"]) or o["meta_info"]["finish_reason"]["type"] != "stop":
            bad.append((p, o["text"], o["meta_info"]["finish_reason"]))
    assert not bad, bad
    smol_engine.check_invariants()


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_smollm2_jump_forward_equivalence(smol_engines, backend):
    """Jump-forward on vs off at temperature 0.  Without jump-forward the model spells forced
    text with whatever allowed token it ranks first, often not the tokenizer's encoding
    ('s', 'ta', 'tu', 's' for a forced "status"), while a jump writes the canonical tokens
    (re-encoding the boundary with the sampled token: ' ' + forced '"' becomes ' "').  So
    the two runs are token-identical up to the first jump that re-tokenizes differently;
    there the jumped token's text is exactly what the run without jumps writes next (same
    text, other tokens); afterwards the contexts differ, so the continuations may.  Both
    outputs are always valid."""
    smol_engine = smol_engines(backend)
    assert len(JF_SCHEMAS) >= 10
    tok = smol_engine.tokenizer
    prompts = [p for p, _ in JF_SCHEMAS] + UNCONSTRAINED[:2]
    params = [{"json_schema": s, "max_new_tokens": SCHEMA_TOKENS, "temperature": 0} for _, s in JF_SCHEMAS]
    params += [{"max_new_tokens": 16, "temperature": 0}] * 2
    outs = {}
    for jf in (False, True):
        set_jump_forward(smol_engine, jf)
        before = smol_engine.stats().get("grammar_jumped_tokens", 0)
        outs[jf] = smol_engine.generate(prompts, params)
        jumped = smol_engine.stats()["grammar_jumped_tokens"] - before
        assert (jumped > 0) == jf
    set_jump_forward(smol_engine, True)
    same_text = 0
    for off, on, (p, s) in zip(outs[False], outs[True], JF_SCHEMAS):
        assert valid("json", s, off["text"]) and valid("json", s, on["text"]), (p, off["text"], on["text"])
        a, b = off["output_ids"], on["output_ids"]
        same_text += off["text"] == on["text"]
        if a == b:
            continue
        i = next(k for k in range(min(len(a), len(b))) if a[k] != b[k])
        assert off["text"].startswith(tok.decode(b[: i + 1], skip_special_tokens=True)), (p, off["text"], on["text"], i)
    assert same_text >= 3, same_text
    assert [o["output_ids"] for o in outs[False][-2:]] == [o["output_ids"] for o in outs[True][-2:]]
