"""Multi-LoRA over HTTP (one tiny-model server with adapters a and b, tests/helpers/lora_server.py):
/generate's ``lora_path`` (one name or one per prompt) gives PEFT's merged model's greedy tokens;
the OpenAI routes select an adapter by ``model`` (an unknown name is a 404); /v1/models lists the adapters; adapters load
and unload while serving (an unload waits for the requests using it); bad paths, unknown names,
ranks over the limit and LoRA on a server without it are 400s naming the field; the admin routes
need an admin key; adapters never share cached prefixes.  KV invariants after every test."""
from __future__ import annotations

import json
import random
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.helpers.lora_server import USER, lora_server
from tests.helpers.server_harness import shared_server

PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]
N = 8
GREEDY = {"max_new_tokens": N, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def lora(tiny_dir):
    return lora_server(tiny_dir)


@pytest.fixture(autouse=True)
def _invariants(request, lora):
    yield
    lora.idle_invariants()


def _gen(c, lora_path=None, ids=PROMPT, sp=GREEDY, **body):
    return c.post("/generate", json={"input_ids": ids, "sampling_params": sp, "lora_path": lora_path, **body})


def _refused(resp, field: str, status: int = 400) -> str:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert err["message"].startswith(field + ":") and err["param"] == field, err
    return err["message"]


def test_generate_equals_peft_merged_model_per_prompt(lora):
    with lora.client() as c:
        outs = {name: _gen(c, name).raise_for_status().json()["output_ids"] for name in (None, "a", "b")}
        mixed = _gen(c, ["a", None, "b"], ids=[PROMPT] * 3).raise_for_status().json()
    for name, got in outs.items():
        assert got == lora.oracle(name, PROMPT, N), name
    assert outs["a"] != outs[None] and outs["b"] != outs[None] and outs["a"] != outs["b"]
    assert [m["output_ids"] for m in mixed] == [outs["a"], outs[None], outs["b"]]


def test_openai_model_names_the_adapter(lora):
    with lora.client() as c:
        base_name = c.get("/v1/models").json()["data"][0]["id"]
        text = {name: _gen(c, name).json()["text"] for name in (None, "a", "b")}

        def complete(model, **extra):
            body = {"model": model, "prompt": PROMPT, "max_tokens": N, "temperature": 0, "ignore_eos": True, **extra}
            r = c.post("/v1/completions", json=body)
            assert r.status_code == 200, r.text
            assert r.json()["model"] == model
            return r.json()["choices"][0]["text"]

        assert complete("a") == text["a"]
        assert complete(f"{base_name}:b") == text["b"]  # SGLang's base:adapter form
        assert complete("b", lora_path="b") == text["b"]
        assert complete(base_name) == text[None]
        for model in (f"{base_name}:zzz", "zzz"):  # never the base model's answer (issue 47)
            _refused(c.post("/v1/completions", json={"model": model, "prompt": "hi"}), "model", 404)
        _refused(c.post("/v1/completions", json={"model": "a", "lora_path": "b", "prompt": "hi"}), "lora_path")

        def chat(model, **extra):
            body = {"model": model, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": N,
                    "temperature": 0, "ignore_eos": True, **extra}
            r = c.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["message"]["content"]

        with_a = chat("a")
        assert with_a == chat(base_name, lora_path="a") and with_a != chat(base_name)


def test_models_lists_the_adapters(lora):
    with lora.client(USER) as c:
        data = c.get("/v1/models").raise_for_status().json()["data"]
    base = data[0]
    assert "parent" not in base
    cards = {m["id"]: m for m in data[1:]}
    assert set(cards) == {"a", "b"}
    assert all(m["parent"] == base["id"] and m["object"] == "model" for m in cards.values())
    assert cards["a"]["root"] == lora.adapters["a"]


def test_load_use_and_unload_while_serving(lora):
    path = lora.adapters["c"]
    with lora.client() as c:
        r = c.post("/load_lora_adapter", json={"lora_name": "c", "lora_path": path})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["success"] and body["loaded_adapters"] == {"a": lora.adapters["a"], "b": lora.adapters["b"],
                                                                "c": path}
        assert body["adapter"]["rank"] == 4 and body["adapter"]["lora_name"] == "c"
        assert "c" in {m["id"] for m in c.get("/v1/models").json()["data"]}
        # a request using c is running when c is unloaded: it finishes with c's weights
        sp = {"max_new_tokens": 256, "temperature": 0, "ignore_eos": True}
        body = {"input_ids": PROMPT, "sampling_params": sp, "lora_path": "c", "stream": True}
        with c.stream("POST", "/generate", json=body) as resp:
            assert resp.status_code == 200
            lines = resp.iter_lines()
            first = next(json.loads(x[6:]) for x in lines if x.startswith("data: {"))
            assert first["meta_info"]["finish_reason"] is None
            r = c.post("/unload_lora_adapter", json={"lora_name": "c"})
            assert r.status_code == 200, r.text
            assert r.json()["requests_in_flight"] == 1 and "c" not in r.json()["loaded_adapters"]
            _refused(_gen(c, "c"), "lora_path")  # refused at once
            last = [json.loads(x[6:]) for x in lines if x.startswith("data: {")][-1]
        assert last["meta_info"]["finish_reason"]["type"] == "length"
        assert last["output_ids"][:N] == lora.oracle("c", PROMPT, N)
        _refused(c.post("/unload_lora_adapter", json={"lora_name": "c"}), "lora_name")
        assert "c" not in {m["id"] for m in c.get("/v1/models").json()["data"]}


def test_concurrent_loads_of_one_name_one_wins(lora):
    with lora.client() as c, ThreadPoolExecutor(2) as pool:
        body = {"lora_name": "d", "lora_path": lora.adapters["c"]}
        codes = sorted(r.status_code for r in pool.map(lambda _: c.post("/load_lora_adapter", json=body), range(2)))
        assert codes == [200, 400]
        assert _gen(c, "d").json()["output_ids"] == lora.oracle("c", PROMPT, N)  # the same weights as c
        assert c.post("/unload_lora_adapter", json={"lora_name": "d"}).status_code == 200


@pytest.mark.parametrize("body,field,words", [
    ({"lora_name": "x", "lora_path": "/nonexistent/adapter"}, "lora_path", "not a directory"),
    ({"lora_name": "x", "lora_path": "BIG"}, "lora_path", "above max_lora_rank 8"),
    ({"lora_name": "x", "lora_path": "TINY"}, "lora_path", "adapter_config.json"),
    ({"lora_name": "a", "lora_path": "C"}, "lora_name", "already loaded"),
    ({"lora_name": "x@1", "lora_path": "C"}, "lora_name", "without '@'"),
    ({"lora_name": "x"}, "lora_path", "required"),
])
def test_bad_loads_are_400s_naming_the_field(lora, body, field, words):
    paths = {"BIG": lora.adapters["big"], "TINY": lora.tiny_dir, "C": lora.adapters["c"]}
    body = {k: paths.get(v, v) for k, v in body.items()}
    with lora.client() as c:
        assert words in _refused(c.post("/load_lora_adapter", json=body), field)
        assert set(c.get("/v1/models").json()["data"][i]["id"] for i in (1, 2)) == {"a", "b"}


def test_unknown_names_are_400s_naming_the_field(lora):
    with lora.client() as c:
        assert "unknown adapter 'nope'" in _refused(_gen(c, "nope"), "lora_path")
        _refused(_gen(c, ["a", "nope"], ids=[PROMPT] * 2), "lora_path")
        _refused(_gen(c, ["a"], ids=[PROMPT] * 2), "lora_path")  # one name per prompt
        _refused(_gen(c, ""), "lora_path")
        _refused(c.post("/unload_lora_adapter", json={"lora_name": "nope"}), "lora_name")
        _refused(_gen(c, None, lora_id="a"), "lora_id")


def test_admin_routes_need_an_admin_key(lora):
    with lora.client(USER) as c:
        for path, body in (("/load_lora_adapter", {"lora_name": "x", "lora_path": lora.adapters["c"]}),
                           ("/unload_lora_adapter", {"lora_name": "a"})):
            r = c.post(path, json=body)
            assert r.status_code == 403 and path in r.json()["error"]["message"], r.text
        assert _gen(c, "a").status_code == 200  # any key generates with an adapter


def test_adapters_never_share_cached_prefixes(lora):
    ids = [random.Random(34).randrange(100, 40000) for _ in range(40)]
    one = {"max_new_tokens": 1, "temperature": 0}
    with lora.client() as c:
        assert _gen(c, "a", ids, one).json()["meta_info"]["cached_tokens"] == 0
        assert _gen(c, "a", ids, one).json()["meta_info"]["cached_tokens"] >= len(ids) - 1
        assert _gen(c, "b", ids, one).json()["meta_info"]["cached_tokens"] == 0
        assert _gen(c, None, ids, one).json()["meta_info"]["cached_tokens"] == 0
        assert _gen(c, "b", ids, one).json()["meta_info"]["cached_tokens"] >= len(ids) - 1


def test_server_without_lora_refuses_it(tiny_dir):
    srv = shared_server(tiny_dir)
    with srv.client() as c:
        assert "not enabled" in _refused(_gen(c, "a"), "lora_path")
        assert "not enabled" in _refused(c.post("/load_lora_adapter", json={"lora_name": "a", "lora_path": "/x"}),
                                         "lora_path")
        _refused(c.post("/unload_lora_adapter", json={"lora_name": "a"}), "lora_path")
        assert [m["id"] for m in c.get("/v1/models").json()["data"]] == [srv.info()["served_model_name"]]
