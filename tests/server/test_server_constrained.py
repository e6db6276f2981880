"""Structured generation through the real multi-process server: /generate with regex /
json_schema / choices mixed with unconstrained prompts, the OpenAI ``response_format``,
and 400s that carry the parser's message.  The tiny model checks the plumbing; SmolLM2
(``slow``) runs every case of tests/constrained_cases.py in one batched /generate call."""
from __future__ import annotations

import json

import openai
import pytest

from tests.helpers.constrained_cases import REGEX_TOKENS, REGEXES, SCHEMA_TOKENS, SCHEMAS, UNCONSTRAINED, valid
from tests.helpers.server_harness import API_KEY, shared_server

PERSON = SCHEMAS[0][1]


@pytest.fixture(scope="session")
def server(tiny_dir):
    return shared_server(tiny_dir)


def test_generate_mixed_batch(server):
    specs = [("regex", r"[0-9]{4}-[0-9]{2}-[0-9]{2}"), ("json_schema", PERSON), ("json_schema", json.dumps(SCHEMAS[17][1])),
             ("choices", ["red", "green", "blue"]), (None, None), (None, None)]
    params = [{k: v, "max_new_tokens": 2 * SCHEMA_TOKENS, "temperature": 1, "seed": i} if k else
              {"max_new_tokens": 16, "temperature": 1, "seed": i} for i, (k, v) in enumerate(specs)]
    with server.client(timeout=300) as c:
        r = c.post("/generate", json={"text": [f"prompt {i}" for i in range(len(specs))], "sampling_params": params})
        assert r.status_code == 200, r.text
        for out, (k, v) in zip(r.json(), specs):
            if k is None:
                assert out["meta_info"]["completion_tokens"] == 16 or out["meta_info"]["finish_reason"]["type"] == "stop"
                continue
            spec = json.loads(v) if k == "json_schema" and isinstance(v, str) else v
            assert out["meta_info"]["finish_reason"]["type"] == "stop", out
            assert valid({"regex": "regex", "choices": "choices"}.get(k, "json"), spec, out["text"]), (k, out["text"])
        # streaming: the cumulative text of a constrained request only grows
        with c.stream("POST", "/generate", json={"text": "s", "stream": True, "sampling_params": {
                "json_schema": PERSON, "max_new_tokens": 2 * SCHEMA_TOKENS, "temperature": 0}}) as s:
            texts = [json.loads(line[6:])["text"] for line in s.iter_lines() if line.startswith("data: {")]
        assert all(b.startswith(a) for a, b in zip(texts, texts[1:])) and valid("json", PERSON, texts[-1])
    assert server.wait_idle()["scheduler"]["running"] == 0


@pytest.mark.parametrize("params,needle", [
    ({"regex": "(a"}, "sampling_params.regex: invalid regular expression: missing ), unterminated subpattern"),
    ({"regex": "(?=a)b"}, "lookaround assertions are not supported"),
    ({"json_schema": "{nope"}, "sampling_params.json_schema: invalid JSON"),
    ({"json_schema": {"type": "foo"}}, "type: foo"),
    ({"json_schema": {"type": "array", "items": {}, "contains": {"const": 1}}}, "contains"),
    ({"ebnf": "root ::= foo"}, "sampling_params.ebnf: not a valid Lark or GBNF grammar"),
    ({"regex": r"\p{NoSuchClass}"}, "sampling_params.regex"),
    ({"json_schema": {"type": "object", "properties": {"x": {"type": "string", "not": {"pattern": "a"}}}}},
     "'not' at #/properties/x"),
    ({"choices": []}, "sampling_params.choices"),
    ({"regex": "a", "choices": ["a"]}, "give only one of"),
])
def test_generate_bad_constraints_are_400(server, params, needle):
    with server.client() as c:
        r = c.post("/generate", json={"text": "hi", "sampling_params": params})
        assert r.status_code == 400, r.text
        assert needle in r.text
        assert c.get("/health").status_code == 200


def test_openai_response_format(server):
    oai = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=300)
    msgs = [{"role": "user", "content": "A person as JSON"}]
    chat = oai.chat.completions.create(model="m", messages=msgs, max_tokens=2 * SCHEMA_TOKENS, temperature=0,
                                       response_format={"type": "json_schema",
                                                        "json_schema": {"name": "person", "schema": PERSON}})
    assert valid("json", PERSON, chat.choices[0].message.content) and chat.choices[0].finish_reason == "stop"
    comp = oai.completions.create(model="m", prompt="Date:", max_tokens=20, temperature=0,
                                  extra_body={"regex": r"[0-9]{2}/[0-9]{2}"})
    assert valid("regex", r"[0-9]{2}/[0-9]{2}", comp.choices[0].text)
    # ebnf (SGLang's field; the default llguidance backend) on both OpenAI routes
    gbnf = 'root ::= ("yes" | "no") "!"'
    comp = oai.completions.create(model="m", prompt="Q:", max_tokens=8, temperature=0, extra_body={"ebnf": gbnf})
    assert comp.choices[0].text in ("yes!", "no!")
    chat = oai.chat.completions.create(model="m", messages=msgs, max_tokens=8, temperature=1, seed=3,
                                       extra_body={"ebnf": 'start: "a" | "b" "c"'})
    assert chat.choices[0].message.content in ("a", "bc")
    with pytest.raises(openai.BadRequestError, match="ebnf: not a valid Lark or GBNF grammar"):
        oai.completions.create(model="m", prompt="Q:", max_tokens=8, extra_body={"ebnf": "root ::= nope"})
    with pytest.raises(openai.BadRequestError, match="response_format: unsupported or invalid schema.*contains"):
        oai.chat.completions.create(model="m", messages=msgs, max_tokens=8, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array", "contains": {"const": 1}}}})
    with pytest.raises(openai.BadRequestError, match="response_format: unsupported or invalid schema"):
        oai.chat.completions.create(model="m", messages=msgs, max_tokens=8, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "foo"}}})
    with pytest.raises(openai.BadRequestError, match="response_format.json_schema.schema"):
        oai.chat.completions.create(model="m", messages=msgs, max_tokens=8,
                                    response_format={"type": "json_schema", "json_schema": {"name": "x"}})


@pytest.mark.slow
def test_smollm2_server_regexes_and_schemas(smol_server):
    srv = smol_server  # the session's SmolLM2 server (30000 slots)
    texts, params, kinds = [], [], []
    for i, (p, rx) in enumerate(REGEXES):
        texts.append(p)
        params.append({"regex": rx, "max_new_tokens": REGEX_TOKENS, "temperature": 1, "seed": i})
        kinds.append(("regex", rx))
    for i, (p, schema) in enumerate(SCHEMAS):
        texts.append(p)
        params.append({"json_schema": schema, "max_new_tokens": SCHEMA_TOKENS, "temperature": 1, "seed": i})
        kinds.append(("json", schema))
    for p in UNCONSTRAINED:
        texts.append(p)
        params.append({"max_new_tokens": 24, "temperature": 1})
        kinds.append(None)
    with srv.client(timeout=900) as c:
        r = c.post("/generate", json={"text": texts, "sampling_params": params})
    assert r.status_code == 200, r.text
    bad = [(t, o["text"], o["meta_info"]["finish_reason"]) for t, o, k in zip(texts, r.json(), kinds)
           if k is not None and (not valid(k[0], k[1], o["text"]) or o["meta_info"]["finish_reason"]["type"] != "stop")]
    assert not bad, bad
    oai = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=300)
    chat = oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "Describe Paris as JSON."}],
                                       max_tokens=SCHEMA_TOKENS, temperature=0, response_format={"type": "json_object"})
    assert isinstance(json.loads(chat.choices[0].message.content), dict)
