"""Hand-written fuzz generators of the routes and fields of wave 3 and after (the older ones:
fuzz_cases.py), and ``nasty_case``, which picks among all of them.

Covered here: unknown fields at every level of every closed body (400 naming the field's path),
model names (unknown: 404 naming ``model``; the served adapter's name: its output), LoRA (``lora_path``
on /generate and the OpenAI routes, ``/load_lora_adapter`` with good, over-rank and broken adapter
directories, ``/unload_lora_adapter``), documents (``segments`` on /generate, ``"document": true``
chat parts, ``document_recompute``), /v1/responses (``previous_response_id``, input items, tools,
``text.format``, the refused fields, GET / DELETE by id), reasoning (``separate_reasoning``,
``chat_template_kwargs``, ``thinking_token_budget``, ``require_reasoning``, /separate_reasoning),
``constraint_budget``, the GET routes (cache inspector with the hierarchical cache's tiers, server
info, models, metrics, flush) with bad query parameters, and wrong methods and paths.
"""
from __future__ import annotations

import copy
import random
from typing import Any, Callable

from radixserve.validation import _clean_loc
from tests.helpers.fuzz_cases import (BASES, FuzzCase, FuzzContext, _case, chat_shapes, constraint,
                                      deep_nesting, enormous, huge_number, invalid_utf8, raw_body, unicode_text,
                                      valid_variants, wrong_type)
from tests.helpers.fuzz_values import BAD_SCHEMAS, UNICODE_TEXTS

CHAT = "/v1/chat/completions"
RESP = "/v1/responses"
GEN = "/generate"
CMPL = "/v1/completions"
TOOL = {"type": "function", "function": {"name": "get_x", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}
RTOOL = {"type": "function", "name": "get_x", "parameters": TOOL["function"]["parameters"]}
SEGMENTS = [{"text": "Intro. "}, {"text": "A document.", "document": True}, {"text": " Question?"}]
DOC_PARTS = [{"type": "text", "text": "Intro. "}, {"type": "text", "text": "A document.", "document": True},
             {"type": "text", "text": " Question?"}]
UNKNOWN_KEYS = ["temprature", "max_tokenz", "stream_option", "foo", "x" * 300, "\u00e9t\u00e9", "", " ", "a.b",
                "0", "__proto__", "constructor", "\U0001F600", "Stream", "max_new_token"]


def _adapter_names(ctx: FuzzContext) -> list[str]:
    """Adapter names the cases use: the served one and those the fuzzer loads (``fz-0`` ...)."""
    return [ctx.adapter or "fz", *(f"fz-{i}" for i in range(8))]


def _model(ctx: FuzzContext) -> str:
    return ctx.served_names[0] if ctx.served_names else "default"


# ---------------------------------------------------------------- unknown fields, model names
def unknown_field(rng: random.Random, ctx: FuzzContext) -> FuzzCase:
    """An unknown key at any level of a closed body: a 400 naming its path (pydantic's, as
    radixserve.validation writes it)."""
    spots: list[tuple[str, dict, str]] = [
        (GEN, BASES[GEN], ""), (GEN, BASES[GEN], "sampling_params"),
        (GEN, {"segments": copy.deepcopy(SEGMENTS), "sampling_params": {"max_new_tokens": 2}}, "segments.1"),
        (CMPL, BASES[CMPL], ""), (CMPL, {**BASES[CMPL], "stream": True, "stream_options": {}}, "stream_options"),
        (CMPL, {**BASES[CMPL], "response_format": {"type": "json_object"}}, "response_format"),
        (CMPL, {**BASES[CMPL], "response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
         "response_format.json_schema"),
        (CHAT, BASES[CHAT], ""), (CHAT, BASES[CHAT], "messages.0"),
        (CHAT, {**BASES[CHAT], "messages": [{"role": "user", "content": copy.deepcopy(DOC_PARTS)}]},
         "messages.0.content.1"),
        (CHAT, {**BASES[CHAT], "tools": [copy.deepcopy(TOOL)]}, "tools.0"),
        (CHAT, {**BASES[CHAT], "tools": [copy.deepcopy(TOOL)]}, "tools.0.function"),
        (CHAT, {**BASES[CHAT], "tools": [copy.deepcopy(TOOL)], "tool_choice": {"type": "function", "function": {
            "name": "get_x"}}}, "tool_choice.function"),
        (CHAT, {**BASES[CHAT], "messages": [{"role": "assistant", "tool_calls": [{"id": "1", "type": "function",
                                                                                 "function": {"name": "f",
                                                                                              "arguments": "{}"}}]},
                                            {"role": "tool", "tool_call_id": "1", "content": "r"}]},
         "messages.0.tool_calls.0.function"),
        (CHAT, {**BASES[CHAT], "stream": True, "stream_options": {"include_usage": True}}, "stream_options"),
        ("/v1/embeddings", BASES["/v1/embeddings"], ""), (RESP, BASES[RESP], ""),
        (RESP, {**BASES[RESP], "input": [{"role": "user", "content": "hi"}]}, "input.0"),
        (RESP, {**BASES[RESP], "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]},
         "input.0.content.0"),
        (RESP, {**BASES[RESP], "tools": [copy.deepcopy(RTOOL)]}, "tools.0"),
        (RESP, {**BASES[RESP], "text": {"format": {"type": "json_object"}}}, "text"),
        (RESP, {**BASES[RESP], "text": {"format": {"type": "json_object"}}}, "text.format"),
        (RESP, {**BASES[RESP], "reasoning": {"effort": "low"}}, "reasoning"),
        (RESP, {**BASES[RESP], "tools": [copy.deepcopy(RTOOL)], "tool_choice": {"type": "function",
                                                                                "name": "get_x"}}, "tool_choice"),
        ("/load_lora_adapter", BASES["/load_lora_adapter"], ""), ("/unload_lora_adapter", BASES["/unload_lora_adapter"], ""),
        ("/separate_reasoning", BASES["/separate_reasoning"], ""),
    ]
    route, body, where = rng.choice(spots)
    key = rng.choice(UNKNOWN_KEYS)
    body = copy.deepcopy(body)
    node: Any = body
    for p in where.split(".") if where else []:
        node = node[int(p)] if isinstance(node, list) else node[p]
    node[key] = rng.choice([1, "x", None, {"a": 1}, [1]])
    loc = tuple(int(p) if p.isdigit() else p for p in where.split(".")) if where else ()
    name = _clean_loc((*loc, key))
    return _case(route, body, f"unknown_field:{route}", (name,), True, ascii=rng.random() < 0.5, expect=(400,))


def model_names(rng: random.Random, ctx: FuzzContext) -> FuzzCase:
    """``model`` on every OpenAI route: an unknown name is a 404 naming ``model`` (LoRA is on, so
    names mean something); a served name or the served adapter answers."""
    route = rng.choice([CMPL, CHAT, RESP, "/v1/embeddings"])
    served = _model(ctx)
    known = ctx.adapter is not None
    options: list[tuple[Any, bool, tuple[int, ...]]] = [
        ("gpt-4o", known, (404,)), ("no-such-model", known, (404,)), ("x" * 5000, known, (404,)),
        (rng.choice(UNICODE_TEXTS), False, ()), (f"{served}:no-such-adapter", known, (404,)),
        (f"{served}:", known, (404,)), (":", known, (404,)), ("fz-" + "9" * 20, known, (404,)),
        (served, False, ()), ("", False, ()), (ctx.adapter or "fz", False, ()), (f"{served}:{ctx.adapter}", False, ()),
        (rng.choice(_adapter_names(ctx)), False, ()),
    ]
    model, must, expect = rng.choice(options)
    body = {**copy.deepcopy(BASES[route]), "model": model}
    if rng.random() < 0.25 and route != "/v1/embeddings":
        body["stream"] = True
    if rng.random() < 0.2 and route in (CMPL, CHAT):  # an explicit lora_path must agree with the model's adapter
        body["lora_path"] = rng.choice(_adapter_names(ctx))
    names = ("model", "lora_path", "messages", "input", "prompt", "body")  # body: a lone surrogate is bad JSON
    return _case(route, body, f"model:{route}", names, must, ascii=rng.random() < 0.5,
                 expect=expect if must else ())


# ---------------------------------------------------------------- LoRA
def lora_requests(rng: random.Random, ctx: FuzzContext) -> FuzzCase:
    """``lora_path`` on /generate (one name, one per prompt, in sampling_params) and the OpenAI routes."""
    names = _adapter_names(ctx)
    good = rng.choice(names)
    bad = rng.choice(["no-such", "", "a@b", "x" * 500, "\u65e5\u672c", " fz", "fz\x00"])
    form = rng.randrange(9)
    body: dict[str, Any]
    route, must = GEN, False
    if form == 0:
        body = {**BASES[GEN], "lora_path": good}
    elif form == 1:
        body = {"text": ["a", "b"], "lora_path": [good, None], "sampling_params": {"max_new_tokens": 3}}
    elif form == 2:
        body, must = {"text": ["a", "b", "c"], "lora_path": [good], "sampling_params": {"max_new_tokens": 3}}, True
    elif form == 3:
        body, must = {**BASES[GEN], "lora_path": bad}, True
    elif form == 4:
        body = {**BASES[GEN], "sampling_params": {"max_new_tokens": 3, "lora_path": good, "n": 2}}
    elif form == 5:
        body, must = {**BASES[GEN], "lora_path": good, "sampling_params": {"max_new_tokens": 3,
                                                                           "lora_path": good + "-other"}}, True
    elif form == 6:
        body = {"input_ids": [[1, 2], [3, 4]], "lora_path": [None, good], "sampling_params": [
            {"max_new_tokens": 2}, {"max_new_tokens": 2, "lora_path": good}]}
    elif form == 7:
        route = rng.choice([CMPL, CHAT])
        body = {**copy.deepcopy(BASES[route]), "lora_path": rng.choice([good, bad])}
        must = body["lora_path"] == bad
    else:
        route = rng.choice([CMPL, CHAT])
        body, must = {**copy.deepcopy(BASES[route]), "model": good, "lora_path": good + "-x"}, True
    body["stream"] = rng.random() < 0.3
    return _case(route, body, f"lora:{route}", ("lora_path", "sampling_params.lora_path", "model"), must)


def lora_admin(rng: random.Random, ctx: FuzzContext) -> FuzzCase:
    """/load_lora_adapter and /unload_lora_adapter: good, over-rank and broken adapter directories,
    names taken, bad names; loads and unloads race the requests that use the adapters."""
    names = _adapter_names(ctx)
    r = rng.random()
    if r < 0.3:  # unload: one the fuzzer loads (maybe loaded), rarely the served one, or an unknown one
        name = rng.choice([*names[1:], *names[1:], names[0], "no-such", "", "a@b", "x" * 300])
        must = name not in names
        return _case("/unload_lora_adapter", {"lora_name": name}, "lora_admin:unload", ("lora_name",), must)
    paths = [ctx.good_adapter] * 4 + list(ctx.broken_adapters.values()) if ctx.good_adapter else []
    path = rng.choice(paths + ["", "/", "/no/such/dir", "/etc/hostname", "/dev/null", "a" * 5000, "\x00",
                               "/tmp/\x00x", "~", "relative/dir", "/proc/self", ctx.model_dir or "/proc"])
    name = rng.choice([*names[1:], names[0], _model(ctx), "", "a@b", "x" * 200, "\u65e5\u672c-" + str(rng.randrange(3)),
                       "n\x00ul"])
    if ctx.loadable and rng.random() < 0.4:  # a free name and a servable directory: it loads (until the limit)
        name, path = rng.choice(names[1:]), rng.choice(ctx.loadable)
    body: dict[str, Any] = {"lora_name": name, "lora_path": path}
    if rng.random() < 0.3:
        body["pinned"] = rng.choice([True, False])
    # a good directory under a free, valid name loads; everything else is refused naming a field
    return _case("/load_lora_adapter", body, "lora_admin:load", ("lora_name", "lora_path"), path not in ctx.loadable)


# ---------------------------------------------------------------- documents
def documents(rng: random.Random, ctx: FuzzContext) -> FuzzCase:
    """``segments`` (valid, batched, broken), ``document_recompute``, chat's document parts."""
    r = rng.randrange(4)
    recompute = rng.choice([None, 0, 0.0, 0.15, 0.5, 1, 1.0, -0.1, 1.0000001, 2, 1e308, "0.5", True, [0.5]])
    bad_recompute = recompute is not None and not (isinstance(recompute, (int, float))
                                                   and not isinstance(recompute, bool) and 0 <= recompute <= 1)
    if r == 0:  # valid segments in their forms
        seg = rng.choice([SEGMENTS, [{"input_ids": [1, 2, 3], "document": True}, {"text": "q"}],
                          [SEGMENTS, [{"text": "Other. "}, {"text": "Doc two.", "document": True}]],
                          [{"text": "Only a document.", "document": True}], [{"text": ""}, {"text": "a"}],
                          [{"text": "a", "document": False}], [{"text": "doc " * 30, "document": True}] * 3,
                          [{"text": "d", "document": True}] * 40])
        sp: dict[str, Any] = {"max_new_tokens": rng.choice([1, 3])}
        if recompute is not None:
            sp["document_recompute"] = recompute
        body = {"segments": copy.deepcopy(seg), "sampling_params": sp, "stream": rng.random() < 0.3}
        return _case(GEN, body, "documents:segments", ("segments", "sampling_params.document_recompute"),
                     bad_recompute)
    if r == 1:  # broken segments
        seg, name = rng.choice([
            ([], "segments"), ([[]], "segments.0"), ([{}], "segments.0"), ("text", "segments"), (5, "segments"),
            ([{"text": "a", "input_ids": [1]}], "segments.0"), ([{"text": 5}], "segments.0.text"),
            ([{"input_ids": ["a"]}], "segments.0.input_ids"), ([{"input_ids": [-1]}], "segments"),
            ([{"input_ids": [10**9]}], "segments"), ([{"input_ids": [2**70]}], "segments"),
            ([{"text": "a", "document": "yes"}], "segments.0.document"),
            ([{"text": "a", "document": 1}], "segments.0.document"),
            ([{"text": "a", "document": None}], "segments.0.document"),
            ([{"text": "a", "extra": 1}], "segments.0.extra"), ([[{"text": "a"}], "x"], "segments.1"),
            (["x"], "segments.0"), ([{"text": "x" * 3000, "document": True}], "segments"),
            ([[{"text": "a"}], [{"text": "b", "document": True}], []], "segments.2"),
            ([{"text": "\ud800", "document": True}], "segments"), ([[[{"text": "a"}]]], "segments.0.0"),
            ([{"input_ids": []}], "segments"), ([{"text": ""}], "segments"), ([{"text": "a", " ": 1}],
                                                                               'segments.0."\\u0020"')])
        body: dict[str, Any] = {"segments": seg, "sampling_params": {"max_new_tokens": 2}}
        if rng.random() < 0.2:
            body["text"] = "both"
        return _case(GEN, body, "documents:bad_segments", (name, "segments", "body"), True, ascii=rng.random() < 0.5)
    if r == 2:  # document_recompute on the OpenAI routes and /generate's sampling_params
        route = rng.choice([GEN, CMPL, CHAT])
        body = copy.deepcopy(BASES[route])
        if route == GEN:
            body["sampling_params"]["document_recompute"] = recompute
        else:
            body["document_recompute"] = recompute
        return _case(route, body, f"documents:recompute:{route}",
                     ("document_recompute", "sampling_params.document_recompute"), bad_recompute)
    parts = copy.deepcopy(DOC_PARTS)  # chat's document parts
    tweak = rng.randrange(8)
    must, name = False, "messages"
    if tweak == 1:
        parts[1]["document"], must, name = rng.choice(["yes", 1, None, [True]]), True, "messages.0.content.1.document"
    elif tweak == 2:
        parts.append({"type": "image_url", "document": True})
        must, name = True, "messages.0.content.3.document"
    elif tweak == 3:
        parts = [{"type": "text", "document": True}]
    elif tweak == 4:
        parts = [{"type": "text", "text": "same", "document": True}] * 3
    elif tweak == 5:
        parts[1]["text"] = "d" * 3000
        must = True
    body = {**BASES[CHAT], "messages": [{"role": "system", "content": copy.deepcopy(DOC_PARTS)},
                                        {"role": "user", "content": parts}]}
    if name.startswith("messages.0"):
        name = name.replace("messages.0", "messages.1", 1)
    if tweak == 6:
        body.update({"tools": [TOOL], "tool_choice": rng.choice(["auto", "required"])})
    if tweak == 7:
        body.update({"chat_template_kwargs": {"enable_thinking": False}, "continue_final_message": True,
                     "messages": [*body["messages"], {"role": "assistant", "content": "Sure"}]})
    if recompute is not None and rng.random() < 0.5:
        body["document_recompute"] = recompute
        must = must or bad_recompute
    body["stream"] = rng.random() < 0.3
    return _case(CHAT, body, "documents:chat", (name, "document_recompute", "messages", "tools", "tool_choice"), must)


# ---------------------------------------------------------------- /v1/responses
def responses(rng: random.Random, ctx: FuzzContext) -> FuzzCase:
    """/v1/responses: continuations, input items, tools, text.format, the refused fields; GET and
    DELETE by id."""
    prev = rng.choice(ctx.response_ids) if ctx.response_ids else "resp_none"
    r = rng.random()
    if r < 0.12:  # GET / DELETE by id
        rid = rng.choice([prev, prev, "resp_no_such", "x" * 3000, "\u65e5\u672c", "resp_" + "0" * 40, "a%20b"])
        if rng.random() < 0.3:
            return FuzzCase("DELETE", f"{RESP}/{rid if rid != prev else 'resp_no_such_either'}", None,
                            "responses:delete", ("response_id",), True, expect=(404,))
        stream = rng.random() < 0.2
        return FuzzCase("GET", f"{RESP}/{rid}" + ("?stream=true" if stream else ""), None, "responses:get",
                        ("response_id", "stream"), stream or rid != prev)
    base = copy.deepcopy(BASES[RESP])
    good: list[tuple[dict, tuple[str, ...]]] = [
        ({"previous_response_id": prev, "input": "And then?"}, ("previous_response_id", "input")),
        ({"previous_response_id": prev, "input": [{"role": "user", "content": "more"}], "store": False},
         ("previous_response_id", "input")),
        ({"input": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [
            {"type": "input_text", "text": "Hi"}]}], "instructions": "Answer."}, ()),
        ({"input": [{"role": "user", "content": "call"}, {"type": "function_call", "call_id": "c1", "name": "get_x",
                                                           "arguments": "{\"a\": 1}"},
                    {"type": "function_call_output", "call_id": "c1", "output": "5"}], "tools": [RTOOL]},
         ("input", "tools")),
        ({"input": [{"type": "reasoning", "summary": [{"type": "summary_text", "text": "hm"}]},
                    {"role": "user", "content": "x"}]}, ("input",)),
        ({"text": {"format": {"type": "json_object"}}}, ("text.format",)),
        ({"text": {"format": {"type": "json_schema", "name": "a", "schema": {"type": "object", "properties": {
            "a": {"type": "integer"}}}}}, "stream": True}, ("text.format",)),
        ({"tools": [RTOOL], "tool_choice": rng.choice(["auto", "required", "none", {"type": "function",
                                                                                   "name": "get_x"}])},
         ("tools", "input")),
        ({"reasoning": {"effort": rng.choice(["none", "low", "high"])}, "stream": rng.random() < 0.5}, ()),
        ({"metadata": {"k": "v"}, "user": "u", "truncation": "disabled", "temperature": 0, "top_k": 1,
          "store": rng.choice([True, False]), "stop": ["\n"], "seed": 7, "priority": 1, "cache_salt": "s"}, ()),
        ({"thinking_token_budget": rng.choice([0, 1, 3]), "stream": rng.random() < 0.5}, ("thinking_token_budget",)),
        ({"chat_template_kwargs": {"enable_thinking": False}}, ()),
        ({"max_output_tokens": 0}, ("max_output_tokens",)), ({"input": "\u65e5\u672c\u8a9e" * 20}, ("input",)),
        ({"model": rng.choice(_adapter_names(ctx))}, ("model",)),
        ({"previous_response_id": ""}, ("previous_response_id",)),
        ({"text": {"format": {"type": "json_schema", "name": "a", "schema": rng.choice(BAD_SCHEMAS)}}},
         ("text.format", "text.format.schema", "input")),  # cycles, huge bounds...: refused or served
    ]
    bad: list[tuple[dict, tuple[str, ...]]] = [
        ({"previous_response_id": rng.choice(["resp_no_such", "x" * 3000, "\u65e5", "resp_\ud800"])},
         ("previous_response_id", "body")),
        ({"background": True}, ("background",)), ({"conversation": rng.choice(["c1", {"id": "c1"}])},
                                                  ("conversation",)),
        ({"prompt": {"id": "p"}}, ("prompt",)), ({"truncation": "auto"}, ("truncation",)),
        ({"max_output_tokens": rng.choice([-1, -(2**63)])}, ("max_output_tokens",)),
        ({"input": []}, ("input",)), ({"input": [{"role": "system", "content": "only"}]}, ("input",)),
        ({"input": [{"type": "web_search_call", "id": "w"}]}, ("input.0",)),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]},
         ("input.0.content.0", "input.0", "input")),
        ({"input": [{"type": "function_call_output", "call_id": "zz", "output": 5}]}, ("input.0.output",)),
        ({"text": {"format": {"type": "json_schema", "name": "a"}}}, ("text.format.schema",)),
        ({"text": {"format": {"type": "yaml"}}}, ("text.format.type",)),
        ({"tools": [{"type": "function", "name": "bad name!"}]}, ("tools.0.name",)),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, ("tools.0",)),
        ({"tools": [RTOOL], "tool_choice": {"type": "function", "name": "nope"}}, ("tool_choice",)),
        ({"tools": [RTOOL], "tool_choice": "required", "text": {"format": {"type": "json_object"}}},
         ("text.format",)),
        ({"reasoning": {"effort": "extreme"}}, ("reasoning.effort",)), ({"metadata": {"a": 5}}, ("metadata.a",)),
        ({"stop": ["x"] * 200}, ("stop",)), ({"thinking_token_budget": -1}, ("thinking_token_budget",)),
        ({"chat_template_kwargs": {"enable_thinking": False}, "thinking_token_budget": 3},
         ("thinking_token_budget",)),
        ({"chat_template_kwargs": {"messages": []}}, ("chat_template_kwargs.messages",)),
        ({"top_p": 0}, ("top_p",)), ({"temperature": -1}, ("temperature",)), ({"cache_salt": ""}, ("cache_salt",)),
        ({"input": "x " * 400}, ("input",)),
    ]
    use_bad = r > 0.55
    extra, names = rng.choice(bad if use_bad else good)
    body = {**base, **copy.deepcopy(extra)}
    if rng.random() < 0.25 and "stream" not in extra:
        body["stream"] = True
    return _case(RESP, body, "responses:" + ("bad" if use_bad else "good"), names or ("input",), use_bad,
                 ascii=rng.random() < 0.5)


# ---------------------------------------------------------------- reasoning, constraint_budget
def reasoning(rng: random.Random, ctx: FuzzContext) -> FuzzCase:
    """``separate_reasoning``, ``chat_template_kwargs``, ``thinking_token_budget``,
    ``require_reasoning``, and /separate_reasoning."""
    r = rng.randrange(5)
    if r == 0:
        text = rng.choice(["<think>a</think>b", "no tags", "</think>", "<think>" * 500, "a</think>" * 300,
                           "x" * 100000, "", rng.choice(UNICODE_TEXTS)])
        parser = rng.choice(["qwen3", "deepseek-r1", "qwen3-thinking", "deepseek-v3", None, "", "bogus", "none",
                             "qwen4", 5])
        body: dict[str, Any] = {"text": text}
        if parser is not None:
            body["reasoning_parser"] = parser
        must = parser in ("bogus", "none", "qwen4", 5) or (parser in (None, "") and not ctx.reasoning)
        return _case("/separate_reasoning", body, "reasoning:separate", ("reasoning_parser", "text", "body"), must,
                     ascii=rng.random() < 0.5)
    if r == 1:  # chat_template_kwargs: good, reserved, template-breaking
        kw, must, names = rng.choice([
            ({"enable_thinking": False}, False, ()), ({"enable_thinking": True}, False, ()),
            ({"enable_thinking": "no"}, False, ("chat_template_kwargs",)), ({"x": [1, {"y": None}]}, False, ()),
            ({}, False, ()), ({"messages": []}, True, ("chat_template_kwargs.messages",)),
            ({"tools": [1]}, True, ("chat_template_kwargs.tools",)),
            ({"add_generation_prompt": False}, True, ("chat_template_kwargs.add_generation_prompt",)),
            ({"namespace": 1}, True, ("chat_template_kwargs",)), ({"raise_exception": 1}, False, ("chat_template_kwargs",)),
            ({"enable_thinking": {"a": 1}}, False, ("chat_template_kwargs",)), ({"k" * 300: 1}, False, ()),
            ({"range": None}, False, ("chat_template_kwargs",)),
            ({"sanitize_control_tokens": True}, True, ("chat_template_kwargs.sanitize_control_tokens",))])
        body = {**BASES[CHAT], "chat_template_kwargs": kw, "stream": rng.random() < 0.3}
        if rng.random() < 0.3:
            body["separate_reasoning"] = rng.choice([True, False])
        return _case(CHAT, body, "reasoning:template_kwargs", names or ("chat_template_kwargs",), must)
    if r == 2:  # thinking_token_budget on chat
        budget = rng.choice([0, 1, 3, -1, 2**40, 2**70])
        off = rng.random() < 0.3
        body = {**BASES[CHAT], "thinking_token_budget": budget, "max_tokens": 6, "stream": rng.random() < 0.4,
                "separate_reasoning": rng.choice([True, False])}
        if off:
            body["chat_template_kwargs"] = {"enable_thinking": False}
        if rng.random() < 0.4:
            body["response_format"] = {"type": "json_object"}
        must = budget < 0 or off or not ctx.reasoning
        return _case(CHAT, body, "reasoning:budget", ("thinking_token_budget",), must)
    if r == 3:  # require_reasoning and the budget on /generate and /v1/completions
        route = rng.choice([GEN, CMPL])
        fields: dict[str, Any] = {"require_reasoning": rng.choice([True, False, True]),
                                  "thinking_token_budget": rng.choice([None, 0, 2, -3])}
        fields = {k: v for k, v in fields.items() if v is not None}
        if rng.random() < 0.5:
            fields["regex"] = "[a-c]{1,3}"
        body = copy.deepcopy(BASES[route])
        if route == GEN:
            body["sampling_params"].update(fields)
            if rng.random() < 0.5 and "require_reasoning" in fields:
                body["require_reasoning"] = body["sampling_params"].pop("require_reasoning")
        else:
            body.update(fields)
        budget = fields.get("thinking_token_budget")
        must = (budget is not None and (budget < 0 or not fields["require_reasoning"])) or \
            (fields["require_reasoning"] and not ctx.reasoning)
        body["stream"] = rng.random() < 0.3
        return _case(route, body, f"reasoning:require:{route}", ("thinking_token_budget", "require_reasoning",
                                                                 "sampling_params.thinking_token_budget",
                                                                 "sampling_params.require_reasoning"), must)
    body = {**BASES[CHAT], "separate_reasoning": rng.choice([True, False]), "stream": rng.random() < 0.5,
            "max_tokens": rng.choice([1, 8]), "n": rng.choice([1, 2])}
    if rng.random() < 0.3:
        body.update({"tools": [TOOL], "tool_choice": rng.choice(["auto", "required"])})
    return _case(CHAT, body, "reasoning:separate_flag", ("messages", "tools"), False)


def constraint_budget(rng: random.Random, ctx: FuzzContext) -> FuzzCase:
    """``constraint_budget`` ("cut" / "close") beside a constraint, and bad values."""
    value = rng.choice(["cut", "close", "cut", "close", "CUT", "", "closed", " close", "\u00e7ut"])
    route = rng.choice([GEN, CMPL, CHAT])
    cons = rng.choice([{"json_schema": {"type": "object", "properties": {"a": {"type": "integer"}}}},
                       {"regex": "[a-z]{1,20}"}, {}, {"ebnf": 'root ::= "a" root | "b"'}])
    body = copy.deepcopy(BASES[route])
    target = body["sampling_params"] if route == GEN else body
    target.update({"constraint_budget": value, **cons})
    if route == CHAT and "json_schema" in cons and rng.random() < 0.5:
        del target["json_schema"]
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "a", "schema": cons["json_schema"]}}
    body["stream"] = rng.random() < 0.3
    must = value not in ("cut", "close")
    return _case(route, body, f"constraint_budget:{route}", ("constraint_budget", "sampling_params.constraint_budget",
                                                               "ebnf", "sampling_params.ebnf"), must)


# ---------------------------------------------------------------- GET routes, methods and paths
def get_routes(rng: random.Random, ctx: FuzzContext) -> FuzzCase:
    """The GET routes (the cache inspector's tiers included) with good and bad query parameters,
    flushes, and wrong methods or paths (an error object naming ``method`` / ``path``)."""
    bad_num = rng.choice(["0", "-1", "65", "abc", "1e3", str(10**30), "", "1.5", "%00", "true"])
    options: list[tuple[str, str, tuple[str, ...], bool]] = [
        ("GET", "/cache/stats", (), False), ("GET", "/cache/tree", (), False),
        ("GET", f"/cache/tree?max_depth={rng.randrange(1, 65)}&max_nodes={rng.randrange(1, 2001)}", (), False),
        ("GET", f"/cache/tree?max_depth={bad_num}", ("query.max_depth", "max_depth"), True),
        ("GET", f"/cache/tree?max_nodes={bad_num.replace('65', '2001')}", ("query.max_nodes", "max_nodes"), True),
        ("GET", "/get_server_info?check_invariants=" + rng.choice(["true", "false", "1"]), (), False),
        ("GET", "/get_server_info?check_invariants=maybe", ("query.check_invariants", "check_invariants"), True),
        ("GET", "/server_info", (), False), ("GET", "/v1/models", (), False), ("GET", "/get_model_info", (), False),
        ("GET", "/metrics", (), False), ("GET", "/health", (), False), ("GET", "/health_generate", (), False),
        ("GET", "/flush_cache", ("flush_cache",), False), ("POST", "/flush_cache", ("flush_cache",), False),
        ("GET", "/generate", ("method",), True), ("PUT", "/v1/completions", ("method",), True),
        ("DELETE", "/v1/chat/completions", ("method",), True), ("GET", "/load_lora_adapter", ("method",), True),
        ("POST", "/v1/models", ("method",), True), ("GET", "/no/such/route", ("path",), True),
        ("POST", "/v1/no_such", ("path",), True), ("GET", "/v1/responses", ("method", "path"), True),
        ("PATCH", f"{RESP}/resp_x", ("method",), True),
    ]
    method, path, names, must = rng.choice(options)
    return FuzzCase(method, path, None, f"get:{path.split('?')[0]}", names, must, headers={})


def regression_cases(ctx: FuzzContext) -> list[FuzzCase]:
    """Inputs that once got a 5xx, a reset connection or a 4xx naming no field: sent once at the
    start of every run (the random generators reach them too, but not surely in a short run)."""
    cases = [
        # a 405 / 404 was FastAPI's {"detail": ...}, not the error object naming a field
        FuzzCase("GET", GEN, None, "regression:method", ("method",), True, headers={}, expect=(405,)),
        FuzzCase("POST", "/no/such/route", b"{}", "regression:path", ("path",), True, expect=(404,)),
        # a template variable that shadows a Jinja global was blamed on messages
        _case(CHAT, {**BASES[CHAT], "chat_template_kwargs": {"namespace": 1}}, "regression:template_kwargs",
              ("chat_template_kwargs",), True, expect=(400,)),
        # an argument of apply_chat_template of its own, not a template variable
        _case(CHAT, {**BASES[CHAT], "chat_template_kwargs": {"sanitize_control_tokens": True}},
              "regression:template_kwargs", ("chat_template_kwargs.sanitize_control_tokens",), True, expect=(400,)),
        # a segment's odd key was named unquoted (a space in the field's name)
        _case(GEN, {"segments": [{"text": "a", "a b": 1}]}, "regression:segments",
              ('segments.0."a\\u0020b"',), True, expect=(400,)),
    ]
    for name in ("garbage", "alpha_str", "alpha_null", "alpha_pattern", "alpha_nan", "alpha_pattern_re", "in_dim"):
        if name in ctx.broken_adapters:  # garbage: a 500 (and the connection reset); alpha: the worker's TypeError
            cases.append(_case("/load_lora_adapter", {"lora_name": f"reg-{name}", "lora_path":
                                                      ctx.broken_adapters[name]}, "regression:lora_load",
                               ("lora_path",), True, expect=(400,)))
    return cases


GENERATORS: list[tuple[Callable[[random.Random, FuzzContext], FuzzCase], int]] = [
    (wrong_type, 30), (huge_number, 12), (enormous, 6), (unicode_text, 8), (invalid_utf8, 3),
    (constraint, 10), (deep_nesting, 3), (raw_body, 5), (chat_shapes, 5), (valid_variants, 8),
    (unknown_field, 8), (model_names, 5), (lora_requests, 6), (lora_admin, 5), (documents, 8), (responses, 10),
    (reasoning, 7), (constraint_budget, 4), (get_routes, 5)]


def nasty_case(rng: random.Random, ctx: FuzzContext | None = None) -> FuzzCase:
    """One case from a generator picked by weight."""
    gens, weights = zip(*GENERATORS)
    return rng.choices(gens, weights)[0](rng, ctx or FuzzContext())
