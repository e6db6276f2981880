"""Hand-written generators of nasty HTTP requests for the server fuzzer (benchmarks/fuzz_server.py).

``nasty_case(rng)`` returns one ``FuzzCase``: a request plus what the oracle may expect of it.
``fields`` are the names one of which a 4xx must name (the generator knows what it broke);
``must_fail`` says a 2xx is wrong too (the input is certainly invalid).  Cases cover
/generate (SGLang's field names), /v1/completions, /v1/chat/completions (tools,
response_format) and /v1/embeddings: wrong types in every field, huge and non-finite numbers,
unicode and invalid UTF-8, huge n / max_tokens / logit_bias / top_logprobs_num, regexes with
catastrophic backtracking or huge automata, JSON schemas with $ref cycles, deep nesting, raw
bodies (invalid JSON, wrong content type, huge bodies).  Valid requests keep outputs short.
"""
from __future__ import annotations

import copy
import json
import random
from dataclasses import dataclass, field
from typing import Any, Optional

from tests.helpers.fuzz_values import (BAD_EBNF, BAD_REGEXES, BAD_SCHEMAS, HUGE_NUMBERS, RAW_NUMBERS, UNICODE_TEXTS,
                         WRONG_VALUES, deep_json)

JSON = "application/json"


@dataclass
class FuzzCase:
    """One request.  ``body`` is sent as is (bytes); ``label`` groups the report."""

    method: str
    path: str
    body: Optional[bytes]
    label: str
    fields: tuple[str, ...] = ()
    must_fail: bool = False
    stream: bool = False
    headers: dict[str, str] = field(default_factory=lambda: {"Content-Type": JSON})
    expect: tuple[int, ...] = ()  # the statuses allowed (empty: any the oracle takes)


@dataclass
class FuzzContext:
    """What the generators know of the server: the adapter it serves from the start, adapter
    directories to load (a good one, broken ones: tests/helpers/fuzz_setup.py), a directory that is
    no adapter, stored responses (``previous_response_id``), its model names, whether it has a
    reasoning parser.  Empty on a server the fuzzer did not launch (the cases then expect less)."""

    adapter: Optional[str] = None
    good_adapter: Optional[str] = None
    broken_adapters: dict[str, str] = field(default_factory=dict)
    loadable: list[str] = field(default_factory=list)  # the directories a load takes (good, or odd but servable)
    model_dir: Optional[str] = None
    reasoning: bool = False
    response_ids: list[str] = field(default_factory=list)
    served_names: list[str] = field(default_factory=list)


def _dumps(obj: Any, ascii: bool = False) -> bytes:
    """JSON bytes; lone surrogates become \\ud800 escapes with ``ascii``, else raw (invalid) UTF-8."""
    return json.dumps(obj, ensure_ascii=ascii, allow_nan=True).encode("utf-8", "surrogatepass")


def _case(path: str, body: Any, label: str, fields: tuple[str, ...] = (), must_fail: bool = False,
          ascii: bool = False, expect: tuple[int, ...] = ()) -> FuzzCase:
    stream = isinstance(body, dict) and body.get("stream") is True
    return FuzzCase("POST", path, _dumps(body, ascii), label, fields, must_fail, stream, expect=expect)


# the smallest valid body of each route, with short outputs
BASES: dict[str, dict[str, Any]] = {
    "/generate": {"text": "Hello", "sampling_params": {"max_new_tokens": 4}},
    "/v1/completions": {"prompt": "Hello", "max_tokens": 4},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
    "/v1/embeddings": {"input": "Hello"},
    "/v1/responses": {"input": "Hi", "max_output_tokens": 4},
    "/tokenize": {"text": "Hello"},
    "/separate_reasoning": {"text": "<think>hm</think>yes", "reasoning_parser": "qwen3"},
    "/unload_lora_adapter": {"lora_name": "no-such-adapter"},
    "/load_lora_adapter": {"lora_name": "fz-new", "lora_path": "/no/such/adapter"},
    "/concate_and_append_request": {"src_rids": ["a"], "dst_rid": "b"},
    "/abort_request": {"rid": "fuzz-no-such-rid"},
}
SP = "sampling_params."
# what a base body's own answer may name (it is a refusal: no such adapter)
BASE_NAMES: dict[str, tuple[str, ...]] = {"/unload_lora_adapter": ("lora_name",), "/abort_request": ("rid",),
                                          "/load_lora_adapter": ("lora_path", "lora_name")}

# the extension fields of both OpenAI generation routes (server/openai_fields.py SHARED_EXTENSIONS) -> kind
OPENAI_EXTENSIONS: dict[str, str] = {
    "top_k": "int", "min_p": "num", "repetition_penalty": "num", "stop_token_ids": "int_list", "ignore_eos": "bool",
    "skip_special_tokens": "bool", "spaces_between_special_tokens": "bool", "regex": "str", "ebnf": "str",
    "structural_tag": "str", "json_schema": "str_or_dict", "constraint_budget": "str", "stop_regex": "str_or_list",
    "no_stop_trim": "bool", "sampling_seed": "int", "custom_params": "dict", "stream_interval": "int",
    "priority": "int", "cache_salt": "str", "lora_path": "str", "document_recompute": "num", "min_tokens": "int",
    "rid": "str", "require_reasoning": "bool", "thinking_token_budget": "int"}

# field path -> its kind (what WRONG_VALUES[kind] is certainly not)
FIELDS: dict[str, dict[str, str]] = {
    "/generate": {
        "text": "text", "input_ids": "int_list", "rid": "str_or_list", "stream": "bool",
        "return_logprob": "bool_s", "top_logprobs_num": "int_s", "logprob_start_len": "int_s",
        "return_text_in_logprobs": "bool", "priority": "int", "cache_salt": "str", "sampling_params": "params",
        **{SP + k: v for k, v in {
            "max_new_tokens": "int", "min_new_tokens": "int", "temperature": "num", "top_p": "num", "top_k": "int",
            "min_p": "num", "repetition_penalty": "num", "frequency_penalty": "num", "presence_penalty": "num",
            "stop": "str_or_list", "stop_token_ids": "int_list", "ignore_eos": "bool", "skip_special_tokens": "bool",
            "logit_bias": "dict", "seed": "int", "n": "int", "regex": "str", "json_schema": "str_or_dict",
            "choices": "str_list", "stop_regex": "str_or_list", "no_stop_trim": "bool", "sampling_seed": "int",
            "custom_params": "dict", "stream_interval": "int", "ebnf": "str", "priority": "int",
            "cache_salt": "str", "constraint_budget": "str", "document_recompute": "num",
            "thinking_token_budget": "int", "lora_path": "str", "require_reasoning": "bool",
            "spaces_between_special_tokens": "bool", "structural_tag": "str"}.items()},
        "segments": "segments", "lora_path": "lora", "require_reasoning": "bool", "image_data": "truthy",
        "return_hidden_states": "truthy", "session_params": "truthy", "lora_id": "truthy", "input_embeds": "truthy"},
    "/v1/completions": {
        "prompt": "text", "max_tokens": "int", "min_tokens": "int", "n": "int", "stream": "bool", "echo": "bool",
        "logprobs": "int", "temperature": "num", "top_p": "num", "top_k": "int", "stop": "str_or_list",
        "seed": "int", "logit_bias": "dict", "regex": "str", "user": "str", "suffix": "str", "best_of": "int",
        "presence_penalty": "num", "frequency_penalty": "num", "stream_options": "dict",
        "response_format": "dict", "model": "str", "ignore_eos": "bool", **OPENAI_EXTENSIONS},
    "/v1/chat/completions": {
        "messages": "list", "max_tokens": "int", "max_completion_tokens": "int", "n": "int", "stream": "bool",
        "logprobs": "bool", "top_logprobs": "int", "temperature": "num", "top_p": "num", "stop": "str_or_list",
        "seed": "int", "logit_bias": "dict", "tools": "list", "tool_choice": "tool_choice",
        "parallel_tool_calls": "bool", "response_format": "dict", "regex": "str", "ebnf": "str",
        "messages.0.role": "str", "messages.0.content": "content", "messages.0.name": "str",
        "continue_final_message": "bool", "chat_template_kwargs": "dict", "separate_reasoning": "bool",
        "stream_options": "dict", "user": "str", "model": "str", **OPENAI_EXTENSIONS},
    "/v1/embeddings": {"input": "text", "encoding_format": "str", "dimensions": "int", "pooling": "str",
                       "normalize": "bool", "model": "str"},
    "/v1/responses": {
        "input": "resp_input", "instructions": "str", "max_output_tokens": "int", "temperature": "num",
        "top_p": "num", "tools": "list", "tool_choice": "tool_choice", "parallel_tool_calls": "bool",
        "text": "dict", "text.format": "dict", "text.format.type": "str", "text.verbosity": "str",
        "reasoning": "dict", "reasoning.effort": "str", "previous_response_id": "str", "store": "bool",
        "stream": "bool", "metadata": "dict", "user": "str", "truncation": "str", "background": "bool",
        "conversation": "str_or_dict", "prompt": "dict", "top_k": "int", "min_p": "num",
        "repetition_penalty": "num", "frequency_penalty": "num", "presence_penalty": "num", "seed": "int",
        "stop": "str_or_list", "priority": "int", "cache_salt": "str", "chat_template_kwargs": "dict",
        "thinking_token_budget": "int", "model": "str"},
    "/tokenize": {"text": "text"},
    "/separate_reasoning": {"text": "str", "reasoning_parser": "str"},
    "/load_lora_adapter": {"lora_name": "str", "lora_path": "str", "pinned": "bool"},
    "/unload_lora_adapter": {"lora_name": "str"},
    "/concate_and_append_request": {"src_rids": "str_list", "dst_rid": "str"},
    "/abort_request": {"rid": "str", "abort_all": "bool"},
}


def _set(body: dict, path: str, value: Any) -> dict:
    """A copy of ``body`` with ``path`` (dotted, list indices as numbers) set to ``value``."""
    body = copy.deepcopy(body)
    parts = path.split(".")
    node: Any = body
    for p in parts[:-1]:
        if isinstance(node, list):
            node = node[int(p)]
        else:
            if not isinstance(node.get(p), (dict, list)):
                node[p] = {}
            node = node[p]
    if isinstance(node, list):
        node[int(parts[-1])] = value
    else:
        node[parts[-1]] = value
    return body


def _names(route: str, path: str) -> tuple[str, ...]:
    """What a 4xx about ``path`` must name: the field (or a path below it)."""
    return (path,)


def wrong_type(rng: random.Random, ctx: FuzzContext) -> FuzzCase:
    route = rng.choice(list(FIELDS))
    path, kind = rng.choice(list(FIELDS[route].items()))
    value = rng.choice(WRONG_VALUES[kind])
    return _case(route, _set(BASES[route], path, value), f"wrong_type:{route}", _names(route, path), True)


def huge_number(rng: random.Random, ctx: FuzzContext) -> FuzzCase:
    """Huge, tiny, negative and non-finite numbers (raw JSON literals) in numeric fields."""
    route = rng.choice([r for r in FIELDS if any(k in ("int", "num") for k in FIELDS[r].values())])
    numeric = [p for p, k in FIELDS[route].items() if k in ("int", "num")]
    path = rng.choice(numeric)
    literal = rng.choice(RAW_NUMBERS + [str(v) for v in HUGE_NUMBERS])
    marker = "__NUM__"
    raw = _dumps(_set(BASES[route], path, marker)).replace(b'"__NUM__"', literal.encode())
    must = literal in ("NaN", "Infinity", "-Infinity", "1e309", "-1e309", "1E400")
    return FuzzCase("POST", route, raw, f"huge_number:{route}", _names(route, path) + ("body",), must)


def enormous(rng: random.Random, ctx: FuzzContext) -> FuzzCase:
    """Enormous n, max_tokens, top_logprobs_num, logprobs, logit_bias, stop lists."""
    big = rng.choice([10**4, 10**6, 2**31, 2**63, 10**30])
    choices: list[tuple[str, str, Any, bool]] = [
        ("/generate", SP + "n", big, True),
        ("/generate", SP + "max_new_tokens", big, False),
        ("/generate", "top_logprobs_num", big, True),
        ("/v1/completions", "n", big, True),
        ("/v1/completions", "max_tokens", big, False),
        ("/v1/completions", "logprobs", big, True),
        ("/v1/chat/completions", "top_logprobs", big, True),
        ("/v1/chat/completions", "n", big, True),
        ("/v1/chat/completions", "max_completion_tokens", big, False),
        ("/generate", SP + "logit_bias", {str(i): rng.uniform(-100, 100) for i in range(rng.choice([10, 49152,
                                                                                                    200000]))}, False),
        ("/v1/completions", "logit_bias", {str(2**40 + i): 1.0 for i in range(1000)}, True),
        ("/generate", SP + "stop", ["x" * rng.randrange(1, 3000) for _ in range(rng.choice([1, 50, 2000]))], False),
        ("/generate", SP + "stop_token_ids", list(range(rng.choice([10, 60000]))), False),
        ("/generate", "rid", "r" * rng.choice([10, 100000]), False),
    ]
    route, path, value, must = rng.choice(choices)
    body = _set(BASES[route], path, value)
    if path == "top_logprobs_num":
        body["return_logprob"] = True
    if route == "/v1/chat/completions" and path == "top_logprobs":
        body["logprobs"] = True
    return _case(route, body, f"enormous:{route}:{path.split('.')[-1]}", _names(route, path), must)


def unicode_text(rng: random.Random, ctx: FuzzContext) -> FuzzCase:
    """Odd unicode (lone surrogates included) in prompts, stop strings, messages, tool names."""
    text = rng.choice(UNICODE_TEXTS)
    route, path = rng.choice([("/generate", "text"), ("/generate", SP + "stop"), ("/generate", SP + "regex"),
                              ("/v1/completions", "prompt"), ("/v1/completions", "stop"),
                              ("/v1/chat/completions", "messages.0.content"), ("/v1/embeddings", "input"),
                              ("/generate", "rid"), ("/v1/chat/completions", "stop"), ("/generate", "cache_salt"),
                              ("/v1/responses", "input"), ("/v1/responses", "instructions"), ("/tokenize", "text"),
                              ("/separate_reasoning", "text"), ("/generate", "lora_path"),
                              ("/v1/chat/completions", "chat_template_kwargs.v"), ("/v1/responses", "stop"),
                              ("/unload_lora_adapter", "lora_name"), ("/v1/responses", "metadata.k")])
    body = _set(BASES[route], path, text)
    if rng.random() < 0.3 and route in ("/generate", "/v1/completions", "/v1/chat/completions", "/v1/responses"):
        body["stream"] = True
    ascii = rng.random() < 0.5
    names = _names(route, path) + ("body", "messages", "input")  # a long text is a prompt too long for the context
    return _case(route, body, f"unicode:{route}", names, False, ascii)


def invalid_utf8(rng: random.Random, ctx: FuzzContext) -> FuzzCase:
    route = rng.choice(list(BASES))
    raw = _dumps(BASES[route])
    bad = rng.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x80"])
    raw = raw.replace(b"H", bad, 1) if b"H" in raw else raw[:-1] + bad + b"}"
    return FuzzCase("POST", route, raw, f"invalid_utf8:{route}", ("body",) + BASE_NAMES.get(route, ()), True)


def constraint(rng: random.Random, ctx: FuzzContext) -> FuzzCase:
    """Catastrophic/huge regexes, $ref cycles and other bad JSON schemas, bad EBNF, anywhere they go."""
    kind = rng.choice(["regex", "stop_regex", "schema", "ebnf", "choices"])
    if kind in ("regex", "stop_regex"):
        value = rng.choice(BAD_REGEXES)
        route, path = rng.choice([("/generate", SP + kind), ("/v1/completions", kind), ("/v1/chat/completions", kind)])
    elif kind == "schema":
        value = rng.choice(BAD_SCHEMAS)
        route, path = rng.choice([("/generate", SP + "json_schema"),
                                  ("/v1/completions", "response_format.json_schema.schema"),
                                  ("/v1/chat/completions", "response_format.json_schema.schema"),
                                  ("/v1/chat/completions", "tools.0.function.parameters")])
    elif kind == "ebnf":
        value, route, path = rng.choice(BAD_EBNF), "/generate", SP + "ebnf"
    else:
        value = rng.choice([[], [""], ["a"] * 5000, ["x" * 20000], [str(i) for i in range(3000)]])
        route, path = "/generate", SP + "choices"
    body = _set(BASES[route], path, value)
    if "response_format" in path:
        body["response_format"]["type"] = "json_schema"
    if path.startswith("tools"):
        body["tools"] = [{"type": "function", "function": {"name": "f", "parameters": value}}]
        body["tool_choice"] = rng.choice(["required", "auto", {"type": "function", "function": {"name": "f"}}])
    body["stream"] = rng.random() < 0.3
    # tools make the chat prompt long: "messages" when it does not fit the fuzz server's context
    names = _names(route, path) + ("response_format", "tools.0", "json_schema", "body", "messages")
    return _case(route, body, f"constraint:{kind}", names)


def deep_nesting(rng: random.Random, ctx: FuzzContext) -> FuzzCase:
    route = rng.choice(list(FIELDS))
    path = rng.choice(list(FIELDS[route]))
    depth = rng.choice([100, 1000, 100000])
    raw = _dumps(_set(BASES[route], path, "__DEEP__")).replace(b'"__DEEP__"', deep_json(depth, rng).encode())
    names = _names(route, path) + ("body",) + BASE_NAMES.get(route, ())
    if rng.random() < 0.2:  # the whole body: a missing required field is named, or the unknown "a"
        raw = deep_json(depth, rng).encode()
        names += ("a", "text", "prompt", "messages", "input")
    # nesting past pydantic's recursion limit is refused; 100 deep may be valid (a JSON schema, an Any field)
    return FuzzCase("POST", route, raw, f"deep:{route}", names, depth >= 1000)


def raw_body(rng: random.Random, ctx: FuzzContext) -> FuzzCase:
    """Not JSON objects, wrong content types, huge bodies."""
    route = rng.choice(list(BASES))
    options: list[tuple[bytes, dict[str, str], bool]] = [
        (b"", {"Content-Type": JSON}, True), (b"{not json", {"Content-Type": JSON}, True),
        (b"null", {}, True), (b"[1,2,3]", {}, True), (b'"text"', {}, True), (b"{}" * 3, {}, True),
        (_dumps(BASES[route]), {"Content-Type": "text/plain"}, False),
        (_dumps(BASES[route]), {"Content-Type": "application/x-www-form-urlencoded"}, False),
        (b"text=hi&max_new_tokens=3", {"Content-Type": "application/x-www-form-urlencoded"}, True),
        (b"\xef\xbb\xbf" + _dumps(BASES[route]), {"Content-Type": JSON}, False),
        (_dumps(BASES[route])[:-1], {}, True), (b"\x00" * 100, {}, True),
        (b'{"a": "' + b"x" * rng.choice([10**5, 4 * 10**6]) + b'"}', {}, True),
        (_dumps({**BASES[route], "pad": ["y" * 1000] * 2000}), {}, False),
    ]
    raw, headers, must = rng.choice(options)
    if route == "/concate_and_append_request" and raw.startswith(b'{"a"'):
        must = False  # a no-op whose body takes unknown keys (as SGLang's): {"a": ...} is a valid body
    names = ("body", "pad", "a", "text", "prompt", "messages", "input", "lora_name") + BASE_NAMES.get(route, ())
    return FuzzCase("POST", route, raw, f"raw:{route}", names, must, headers=headers)


def chat_shapes(rng: random.Random, ctx: FuzzContext) -> FuzzCase:
    """Tool calling and message shapes of the chat route."""
    base = BASES["/v1/chat/completions"]
    tool = {"type": "function", "function": {"name": "get_x", "parameters": {"type": "object", "properties": {
        "a": {"type": "integer"}}}}}
    options: list[tuple[dict, tuple[str, ...], bool]] = [
        ({**base, "tools": [tool], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         ("tool_choice",), True),
        ({**base, "tools": [{"type": "function", "function": {"name": "bad name!"}}]}, ("tools.0.function.name",), True),
        ({**base, "tools": [tool] * 300, "tool_choice": "required"}, ("tools", "messages"), False),
        ({**base, "messages": [{"role": "tool", "content": "x"}]}, ("messages.0.tool_call_id",), True),
        ({**base, "messages": [{"role": "user", "content": [{"type": "image_url"}, {"type": "text", "text": 5}]}]},
         ("messages.0.content",), True),
        ({**base, "messages": [{"role": "assistant", "tool_calls": [{"id": "1", "function": {
            "name": "f", "arguments": "{not json"}}]}, {"role": "tool", "tool_call_id": "1", "content": "r"}]},
         ("messages",), False),
        ({**base, "messages": [{"role": "user", "content": "x" * 50000}]}, ("messages",), True),
        ({**base, "messages": [{"role": "user", "content": "hi"}] * 2000}, ("messages",), True),
        ({**base, "tools": [tool], "tool_choice": "required", "response_format": {"type": "json_object"}},
         ("response_format",), True),
        ({**base, "tools": [tool], "tool_choice": "auto", "parallel_tool_calls": False, "stream": True}, (), False),
        ({**base, "response_format": {"type": "json_schema"}}, ("response_format.json_schema",), True),
        ({**base, "response_format": {"type": "json_object"}, "stream": True, "stream_options": {
            "include_usage": True}}, (), False),
        ({**base, "logprobs": True, "top_logprobs": 20, "n": 3}, (), False),
    ]
    body, names, must = rng.choice(options)
    return _case("/v1/chat/completions", body, "chat_shapes", names, must)


def valid_variants(rng: random.Random, ctx: FuzzContext) -> FuzzCase:
    """Valid but unusual requests (streamed, logprobs, n > 1, batches, penalties, extreme sampling)."""
    route = rng.choice(["/generate", "/v1/completions", "/v1/chat/completions"])
    body = copy.deepcopy(BASES[route])
    extra = rng.choice([
        {"temperature": 1e-30}, {"temperature": 1e30}, {"top_p": 1e-300}, {"top_k": 1}, {"min_p": 1.0},
        {"repetition_penalty": 1e-30}, {"repetition_penalty": 1e30}, {"frequency_penalty": -2}, {"seed": 2**63 - 1},
        {"seed": -(2**63)}, {"seed": 2**70}, {"logit_bias": {"0": 1e30, "1": -1e30}}, {"logit_bias": {"5": 1e308}},
        {"n": 4}, {"stop": ["\x00", "l"]}, {"stop_token_ids": [0, 1, 2]}, {"regex": "[a-c]{1,3}"},
        {"ignore_eos": True}, {"min_new_tokens": 4}, {"priority": -(2**70)}])
    if route == "/generate":
        body["sampling_params"].update(extra)
        body.update(rng.choice([{}, {"return_logprob": True, "top_logprobs_num": 5, "logprob_start_len": 0},
                                {"text": ["a", "b", "c"]}, {"text": None, "input_ids": [[1, 2], [3]]},
                                {"return_text_in_logprobs": True}]))
    else:
        body.update({k if k != "min_new_tokens" else "min_tokens": v for k, v in extra.items()})
        if route == "/v1/completions" and rng.random() < 0.3:
            body.update({"echo": True, "logprobs": 3})
    body["stream"] = rng.random() < 0.5
    return _case(route, body, f"valid:{route}", tuple(extra) + ("max_new_tokens", "max_tokens", "body"))
