"""OpenAI-compatible routes: /v1/models, /v1/completions (/v1/chat/completions: chat.py).

``response_format`` ``{"type": "json_object"}`` constrains the output to a JSON object,
``{"type": "json_schema", "json_schema": {"schema": ...}}`` to the schema (SGLang's ``regex``
extension is accepted too).  Choices are ordered prompt-major (choice ``i * n + j`` is copy j of prompt i); usage
counts each prompt once and reports ``prompt_tokens_details.cached_tokens``.  Errors use
OpenAI's names for the fields (``max_tokens``, ``prompt``, ``messages``...).  ``echo`` and
prompt logprobs on /v1/completions: see ``completion_view.py``.  A ``model`` that names a loaded
LoRA adapter (or ``<served name>:<adapter>``) generates with it (``lora_routes.apply_model_adapter``); with
LoRA on or ``--served-model-name`` set, any name but those and the served names is a 404 naming ``model``.
/v1/models lists the served names and each adapter (``parent``: the first served name).  A body's unknown
field is a 400 naming it (the fields each route takes: ``server/openai_fields.py``).
"""
from __future__ import annotations

import time
import uuid
from typing import Any, Optional

from fastapi import APIRouter, Request
from fastapi.responses import Response

from radixserve.server.http_utils import first_and_rest, parse_body, stream_response
from radixserve.server.lora_routes import adapter_cards, apply_model_adapter
from radixserve.server.openapi_doc import body_doc
from radixserve.server.openai.completion_view import CompletionView, prompt_texts
from radixserve.server.protocol import OPENAI_SAMPLING_FIELDS, CompletionRequest
from radixserve.server.req_state import ReqState, RequestError

_RENAMES = {"sampling_params.max_new_tokens": "max_tokens", "sampling_params.min_new_tokens": "min_tokens",
            "sampling_params.json_schema": "response_format", "sampling_params.": ""}


def _openai_names(e: RequestError) -> RequestError:
    msg = e.message
    for old, new in _RENAMES.items():
        msg = msg.replace(old, new)
    return RequestError(e.status, msg, e.headers)


def sampling_dict(req: Any, max_tokens: Optional[int], default_max: int) -> dict[str, Any]:
    """The ``SamplingParams`` dict of an OpenAI request (an ``_OpenAIBase``)."""
    d: dict[str, Any] = {name: getattr(req, name) for name in OPENAI_SAMPLING_FIELDS if getattr(req, name) is not None}
    d["max_new_tokens"] = default_max if max_tokens is None else max_tokens
    d["n"] = req.n
    if req.min_tokens is not None:
        d["min_new_tokens"] = req.min_tokens
    rf = req.response_format
    if rf is not None and rf.type == "json_object":
        d["json_schema"] = {"type": "object"}
    elif rf is not None and rf.type == "json_schema":
        if rf.json_schema is None or rf.json_schema.schema_ is None:
            raise RequestError(400, "response_format.json_schema.schema: required for type json_schema")
        d["json_schema"] = rf.json_schema.schema_
    if getattr(req, "json_schema", None) is not None:  # SGLang's extension field
        if "json_schema" in d:
            raise RequestError(400, "json_schema: give either json_schema or response_format, not both")
        d["json_schema"] = req.json_schema
    if "json_schema" in d and "regex" in d:
        raise RequestError(400, "regex: give either regex or response_format, not both")
    return d


def finish_str(st: ReqState) -> Optional[str]:
    return None if st.finish_reason is None else st.finish_reason.get("type")


def usage(states: list[ReqState], n: int) -> dict[str, Any]:
    firsts = states[::n]
    prompt = sum(len(st.input_ids) for st in firsts)
    completion = sum(len(st.output_ids) for st in states)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": sum(st.cached_tokens for st in firsts)}}


class ChunkStream:
    """How a streamed OpenAI response wraps its choices: ``chunk(choice)`` is one chunk
    (``usage`` null when the client asked for usage), ``tail(states, n)`` the final usage-only
    chunk once every state is done (``stream_options.include_usage``), else nothing."""

    def __init__(self, req: Any, base: dict[str, Any], obj: str) -> None:
        self.base, self.obj = base, obj
        self.include_usage = bool(req.stream_options and req.stream_options.include_usage)

    def chunk(self, choice: dict[str, Any]) -> list[dict[str, Any]]:
        out = {**self.base, "object": self.obj, "choices": [choice]}
        if self.include_usage:
            out["usage"] = None
        return [out]

    def tail(self, states: list[ReqState], n: int) -> list[dict[str, Any]]:
        if not self.include_usage or not all(st.done for st in states):
            return []
        return [{**self.base, "object": self.obj, "choices": [], "usage": usage(states, n)}]


def openai_router(ctx: Any) -> APIRouter:
    """The OpenAI routes over ``ctx`` (the app's ``ServerContext``)."""
    tm = ctx.tm
    router = APIRouter()

    def submit(prompts: list[list[int]], names: list[str], params: dict, rid: Optional[str], top: Optional[int],
               logprob_start: int = -1):
        rids = None
        if rid is not None:
            rids = [rid] if len(prompts) == 1 else [f"{rid}-{i}" for i in range(len(prompts))]
        try:
            reqs = tm.build(prompts, [params] * len(prompts), names, rids, top is not None, logprob_start, top or 0)
        except RequestError as e:
            raise _openai_names(e) from None
        return tm.submit(reqs)

    @router.get("/v1/models")
    async def models():
        bases = [{"id": name, "object": "model", "created": 0, "owned_by": "radixserve", "root": ctx.model_path,
                  "max_model_len": tm.info.context_len} for name in ctx.server_cfg.served_model_name or [ctx.model_name]]
        return {"object": "list", "data": [*bases, *adapter_cards(ctx)]}

    async def respond(req: Any, states: list[ReqState], request: Request, top: Optional[int],
                      view: CompletionView):
        rid = f"cmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        base = {"id": rid, "created": created, "model": req.model or ctx.model_name}
        n = req.n
        if not req.stream:
            if not await tm.run_to_end(states, request.is_disconnected):
                return Response(status_code=499)
            choices = []
            for st in states:
                c: dict[str, Any] = {"index": st.index, "finish_reason": finish_str(st), "logprobs": None}
                c["text"] = view.text(st, st.text, True)
                if top is not None:
                    c["logprobs"] = view.logprobs(st, 0, top, True)
                choices.append(c)
            return {**base, "object": "text_completion", "choices": choices, "usage": usage(states, n)}

        chunks = ChunkStream(req, base, "text_completion")
        sent_text = {st.index: 0 for st in states}
        sent_lp = {st.index: 0 for st in states}
        opened: set[int] = set()  # choices whose first chunk went out

        def render(st: ReqState) -> list:
            i = st.index
            delta, first = st.text[sent_text[i]:], i not in opened
            if not delta and st.finish_reason is None and not (first and view.echo):
                return []
            opened.add(i)
            c: dict[str, Any] = {"index": i, "finish_reason": finish_str(st), "logprobs": None}
            c["text"] = view.text(st, delta, first)
            if top is not None:
                c["logprobs"] = view.logprobs(st, sent_lp[i], top, first)
            sent_text[i], sent_lp[i] = len(st.text), len(st.output_logprobs)
            return chunks.chunk(c)

        def tail() -> list:
            return chunks.tail(states, n)

        first, events = await first_and_rest(tm.events(states, request.is_disconnected))
        return stream_response(first, events, render, tail)

    @router.post("/v1/completions", openapi_extra=body_doc(CompletionRequest, stream=True))
    async def completions(request: Request):
        req = await parse_body(request, CompletionRequest)
        if req.suffix:
            raise RequestError(400, "suffix: not supported")
        if req.best_of not in (None, req.n):
            raise RequestError(400, "best_of: only best_of == n is supported")
        p = req.prompt
        if isinstance(p, str):
            prompts, names = [tm.encode(p)], ["prompt"]
        elif p and all(isinstance(x, int) for x in p):
            prompts, names = [list(p)], ["prompt"]
        else:
            prompts = [tm.encode(x) if isinstance(x, str) else list(x) for x in p]
            names = [f"prompt.{i}" for i in range(len(prompts))]
        if not prompts:
            raise RequestError(400, "prompt: the prompt is empty")
        params = sampling_dict(req, req.max_tokens, 16)
        apply_model_adapter(ctx, req.model, params)
        if req.echo:  # the view decodes the prompts' ids: check them first (out-of-range ids were a 500)
            for ids, name in zip(prompts, names):
                tm.check_prompt(ids, name)
        view = CompletionView(tm, prompt_texts(tm, p, prompts) if req.echo else None, req.n)
        # echo with logprobs scores the prompt too (its first token has no logprob)
        states = submit(prompts, names, params, req.rid, req.logprobs, 0 if req.echo else -1)
        return await respond(req, states, request, req.logprobs, view)

    return router
