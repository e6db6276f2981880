"""Table-driven malformed requests: each gets a 4xx whose message names the field, and
the server stays healthy."""
from __future__ import annotations

import pytest

from tests.helpers.server_harness import shared_server

HI = {"text": "hi"}
CASES = [
    ("/generate", "{not json", "body"),
    ("/generate", "[1, 2]", "body"),
    ("/generate", {}, "text"),
    ("/generate", {"text": "hi", "input_ids": [1, 2]}, "text"),
    ("/generate", {"text": 5}, "text"),
    ("/generate", {"text": ""}, "text"),
    ("/generate", {"text": []}, "text"),
    ("/generate", {"input_ids": []}, "input_ids"),
    ("/generate", {"input_ids": [1, "a"]}, "input_ids"),
    ("/generate", {"input_ids": [1, 10**9]}, "input_ids"),
    ("/generate", {"input_ids": [-3]}, "input_ids"),
    ("/generate", {"input_ids": [5] * 2000}, "input_ids"),
    ("/generate", {"input_ids": [[1, 2], []]}, "input_ids.1"),
    ("/generate", {**HI, "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
    ("/generate", {**HI, "sampling_params": {"max_new_tokens": "ten"}}, "max_new_tokens"),
    ("/generate", {**HI, "sampling_params": {"top_p": 0}}, "top_p"),
    ("/generate", {**HI, "sampling_params": {"top_p": 1.5}}, "top_p"),
    ("/generate", {**HI, "sampling_params": {"temperature": -0.5}}, "temperature"),
    ("/generate", {**HI, "sampling_params": {"top_k": -7}}, "top_k"),
    ("/generate", {**HI, "sampling_params": {"n": 0}}, "n"),
    ("/generate", {**HI, "sampling_params": {"stop": [""]}}, "stop"),
    ("/generate", {**HI, "sampling_params": {"stop_token_ids": [-5]}}, "stop_token_ids"),
    ("/generate", {**HI, "sampling_params": {"logit_bias": {"999999999": 1.0}}}, "logit_bias"),
    ("/generate", {**HI, "sampling_params": {"min_new_tokens": 9, "max_new_tokens": 2}}, "min_new_tokens"),
    ("/generate", {**HI, "sampling_params": {"bogus": 1}}, "bogus"),
    ("/generate", {**HI, "sampling_params": "greedy"}, "sampling_params"),
    ("/generate", {"text": ["a", "b"], "sampling_params": [{}]}, "sampling_params"),
    ("/generate", {**HI, "stream": "maybe"}, "stream"),
    ("/generate", {**HI, "return_logprob": True, "top_logprobs_num": -1}, "top_logprobs_num"),
    ("/generate", {**HI, "logprob_start_len": -5}, "logprob_start_len"),
    ("/generate", {"text": ["a", "b"], "rid": ["only-one"]}, "rid"),
    ("/abort_request", {}, "rid"),
    ("/v1/completions", {}, "prompt"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": -1}, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "top_p": 2}, "top_p"),
    ("/v1/completions", {"prompt": "hi", "n": "two"}, "n"),
    ("/v1/completions", {"prompt": "hi", "logprobs": 99}, "logprobs"),
    ("/v1/completions", {"prompt": ""}, "prompt"),
    ("/v1/chat/completions", {"messages": []}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 50}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, "temperature"),
    # found by the fuzzer (benchmarks/fuzz_server.py)
    ("/generate", "[" * 100000 + "]" * 100000, "body"),  # json.loads' RecursionError was a 500
    ("/generate", b'{"text": "\xff\xfe"}', "body"),
    ("/generate", '{"text": "hi", "sampling_params": {"temperature": NaN}}', "sampling_params.temperature"),
    ("/generate", '{"text": "hi", "sampling_params": {"top_p": 1e309}}', "sampling_params.top_p"),
    ("/generate", {**HI, "sampling_params": {"max_new_tokens": "5"}}, "sampling_params.max_new_tokens"),  # strict
    ("/generate", {**HI, "return_logprob": 1}, "return_logprob"),
    ("/v1/completions", {"prompt": "hi", "echo": 1}, "echo"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 2.5}, "n"),
    ("/generate", {**HI, "sampling_params": {"stop_regex": "a{2147483648}"}}, "sampling_params.stop_regex"),  # OOM
    ("/generate", {**HI, "sampling_params": {"stop_regex": "(a{1000}){1000}"}}, "sampling_params.stop_regex"),
    ("/generate", {**HI, "sampling_params": {"stop_regex": "x" * 100000}}, "sampling_params.stop_regex"),  # hang
    ("/generate", {**HI, "sampling_params": {"stop": ["x" * 3000] * 2000}}, "sampling_params.stop"),  # hang
    ("/generate", {**HI, "sampling_params": {"n": 10**6}}, "sampling_params.n"),
    ("/generate", {**HI, "sampling_params": {"json_schema": "[" * 100000}}, "sampling_params.json_schema"),
    ("/v1/completions", {"prompt": "hi", "stop": ["y"] * 1000}, "stop"),
    ("/v1/completions", {"prompt": [[-(2**70)]], "echo": True}, "prompt.0"),  # echo decoded it first: a 500
    ("/v1/completions", {"prompt": [10**9], "echo": True}, "prompt"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": -(2**70)},
     "max_completion_tokens"),  # was named max_tokens
]


@pytest.fixture(scope="session")
def server(tiny_dir):
    return shared_server(tiny_dir)


@pytest.mark.parametrize("path,body,field", CASES, ids=[f"{i}-{c[2]}" for i, c in enumerate(CASES)])
def test_bad_input_names_field(server, path, body, field):
    with server.client() as c:
        if isinstance(body, (str, bytes)):
            r = c.post(path, content=body, headers={"Content-Type": "application/json"})
        else:
            r = c.post(path, json=body)
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    err = r.json()["error"]
    assert field in err["message"], err
    assert err["type"] == "invalid_request_error"


def test_errors_name_the_field_as_sent(server):
    """The top-level ``cache_salt`` of /generate is named as sent (it was called
    sampling_params.cache_salt, a field the client never sent)."""
    with server.client() as c:
        r = c.post("/generate", json={**HI, "cache_salt": "s" * 3000})
        assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt", r.text
        # a client's dict key with a space stays one path token (the message named no field)
        r = c.post("/v1/completions", json={"prompt": "hi", "logit_bias": {"| x": 1}})
        assert r.status_code == 400 and r.json()["error"]["param"].startswith("logit_bias."), r.text


def test_healthy_after_bad_input(server):
    with server.client() as c:
        assert c.get("/health").status_code == 200
        assert c.get("/health_generate").status_code == 200
        out = c.post("/generate", json={"text": "still fine", "sampling_params": {"max_new_tokens": 3}}).json()
        assert out["meta_info"]["completion_tokens"] == 3
    info = server.wait_idle()
    assert info["scheduler"]["invariants_ok"] and info["scheduler"]["held_slots"] == 0
