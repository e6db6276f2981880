"""FastAPI app: the native SGLang-compatible routes (the OpenAI routes live in openai/routes.py,
the LoRA adapter admin routes in lora_routes.py).

POST /generate returns {text, output_ids, meta_info} (a list for batched input or n > 1)
or, with ``stream``, SSE chunks ``data: {...}`` with cumulative text and an ``index``,
ending ``data: [DONE]``.  Errors before the first chunk are HTTP errors; a failure after
it arrives as a ``data: {"error": ...}`` chunk.  ``lora_path`` (SGLang's) names a loaded LoRA
adapter for every prompt, or gives one name (or null: the base model) per prompt.  ``segments``
(radixserve's) gives the prompt as segments in place of ``text`` / ``input_ids``, marking documents
that may be reused out of order (radixserve/tokenizer.py); ``meta_info`` then counts
``document_reused_tokens`` and ``document_recomputed_tokens``.  ``require_reasoning`` (SGLang's, with
``--reasoning-parser``): the output starts thinking, so a constraint applies after the think-end token
(the text stays whole: ``/separate_reasoning`` splits it, reasoning_routes.py).
"""
from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from typing import Optional, Union

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel

from radixserve.config import EngineConfig, ServerConfig
from radixserve.request_builder import Prompts, split_prompts
from radixserve.server.http_utils import (APIKeyMiddleware, error_body, first_and_rest, install_error_handlers,
                                         parse_body, stream_response)
from radixserve.server.inspector.routes import DASHBOARD_PATHS, inspector_router
from radixserve.server.lora_routes import lora_router
from radixserve.server.reasoning_routes import reasoning_router
from radixserve.server.tenancy.key_auth import KeyAuthMiddleware
from radixserve.server.tenancy.keys import KeyStore
from radixserve.server.openai.routes import openai_router
from radixserve.server.openapi_doc import body_doc, install_openapi
from radixserve.server.openai.embeddings import embeddings_router
from radixserve.server.openai.chat import chat_router
from radixserve.server.openai.responses import responses_router
from radixserve.server.protocol import AbortReqInput, ConcatAndAppendReqInput, GenerateReqInput
from radixserve.server.req_state import RequestError
from radixserve.server.tokenizer_manager import TokenizerManager
from radixserve.server.tenancy.usage_api import usage_router


class TokenizeReqInput(BaseModel):
    """POST /tokenize."""

    text: Union[str, list[str]]


@dataclass
class ServerContext:
    tm: TokenizerManager
    engine_cfg: EngineConfig
    server_cfg: ServerConfig
    model_name: str
    model_path: str
    tokenizer_path: str
    pids: dict[str, int]
    keys: Optional[KeyStore] = None  # multi-key mode (--api-keys-file)


def native_inputs(ctx: ServerContext, obj: GenerateReqInput) -> Prompts:
    """A /generate body split per prompt (``split_prompts``); RequestError(400) naming the field."""
    sp = obj.sampling_params
    params = [p.to_dict() for p in sp] if isinstance(sp, list) else sp.to_dict() if sp is not None else None
    try:
        return split_prompts(obj.text, obj.input_ids, params, ctx.tm.encode, obj.rid, obj.priority, obj.cache_salt,
                             lora_path=obj.lora_path, segments=obj.segments, encode_plain=ctx.tm.encode_plain,
                             require_reasoning=obj.require_reasoning)
    except ValueError as e:
        raise RequestError(400, str(e)) from None


def create_app(ctx: ServerContext) -> FastAPI:
    tm = ctx.tm
    app = FastAPI(title="radixserve")
    install_error_handlers(app)
    open_paths = ("/health", *DASHBOARD_PATHS)  # the inspector page is static; its data needs a key
    install_openapi(app)
    if ctx.keys is not None:
        app.add_middleware(KeyAuthMiddleware, store=ctx.keys, open_paths=open_paths)
    elif ctx.server_cfg.api_key:
        app.add_middleware(APIKeyMiddleware, api_key=ctx.server_cfg.api_key, open_paths=open_paths)
    app.include_router(openai_router(ctx))
    app.include_router(embeddings_router(ctx))
    app.include_router(usage_router(ctx))
    app.include_router(chat_router(ctx))
    app.include_router(responses_router(ctx))
    app.include_router(inspector_router(ctx))
    app.include_router(lora_router(ctx))
    app.include_router(reasoning_router(ctx))

    @app.post("/generate", openapi_extra=body_doc(GenerateReqInput, stream=True))
    async def generate(request: Request):
        obj = await parse_body(request, GenerateReqInput)
        p = native_inputs(ctx, obj)
        reqs = tm.build(p.ids, p.params, p.names, p.rids, obj.return_logprob, obj.logprob_start_len,
                        obj.top_logprobs_num, doc_spans=p.spans)
        states = tm.submit(reqs)
        text_fn = tm.token_text if obj.return_text_in_logprobs else None
        if obj.stream:
            first, events = await first_and_rest(tm.events(states, request.is_disconnected))
            return stream_response(first, events, lambda st: [{**st.to_native(text_fn), "index": st.index}])
        if not await tm.run_to_end(states, request.is_disconnected):
            return Response(status_code=499)
        outs = [st.to_native(text_fn) for st in states]
        return outs if p.batched or len(outs) > 1 else outs[0]

    @app.get("/health", response_class=Response)
    async def health():
        if not tm.healthy:
            return JSONResponse(error_body(503, f"server unhealthy: {tm.dead_reason}"), status_code=503)
        return Response(status_code=200)

    @app.get("/health_generate", response_class=Response)
    async def health_generate():
        reqs = tm.build([tm.encode("hi") or [0]], [{"max_new_tokens": 1, "temperature": 0}], ["text"], None)
        states = tm.submit(reqs)
        try:
            await asyncio.wait_for(tm.run_to_end(states), timeout=30)
        except asyncio.TimeoutError:
            return JSONResponse(error_body(503, "health_generate: timed out"), status_code=503)
        return Response(status_code=200)

    @app.get("/get_model_info")
    async def get_model_info():
        return {"model_path": ctx.model_path, "tokenizer_path": ctx.tokenizer_path, "is_generation": True,
                **await tm.chat_template_info()}

    @app.post("/tokenize", openapi_extra=body_doc(TokenizeReqInput))
    async def tokenize(request: Request):
        """{text: str | [str]} -> {input_ids}: the ids /generate uses for that ``text``."""
        obj = await parse_body(request, TokenizeReqInput)
        if isinstance(obj.text, str):
            return {"input_ids": tm.encode(obj.text)}
        return {"input_ids": [tm.encode(t) for t in obj.text]}

    @app.post("/concate_and_append_request", openapi_extra=body_doc(ConcatAndAppendReqInput))
    async def concate_and_append(request: Request):
        """SGLang's frontend asks to splice the KV of fork branches into the parent; here it is
        a no-op that succeeds: the parent's next request sends the concatenated text, whose
        shared prefix the radix cache reuses (the tokens are computed normally, so results
        match plain text concatenation)."""
        await parse_body(request, ConcatAndAppendReqInput)
        return {"success": True}

    @app.get("/get_server_info")
    @app.get("/server_info")
    async def get_server_info(check_invariants: bool = False):
        cfg = ctx.engine_cfg
        info = {**dataclasses.asdict(cfg.model), **dataclasses.asdict(cfg.cache), **dataclasses.asdict(cfg.scheduler),
                "host": ctx.server_cfg.host, "port": ctx.server_cfg.port, "model_path": ctx.model_path,
                **dataclasses.asdict(cfg.lora), "served_model_name": ctx.model_name, "pids": ctx.pids,
                "worker": dataclasses.asdict(tm.info)}
        if tm.lora is not None:
            from radixserve.lora.registry import lora_summary

            info["lora_adapters"] = [lora_summary(a) for a in tm.lora.adapters.values()]
        info["scheduler"] = await tm.control("stats+check" if check_invariants else "stats")
        info["in_flight_requests"] = len(tm.states)
        return info

    @app.get("/flush_cache", operation_id="flush_cache_get")
    @app.post("/flush_cache", operation_id="flush_cache_post")
    async def flush_cache():
        if await tm.control("flush_cache"):
            return {"success": True, "message": "Cache flushed."}
        raise RequestError(400, "flush_cache: refused while requests are running")

    @app.post("/abort_request", openapi_extra=body_doc(AbortReqInput))
    async def abort_request(request: Request):
        obj = await parse_body(request, AbortReqInput)
        if not obj.rid and not obj.abort_all:
            raise RequestError(400, "rid: give a request id or abort_all: true")
        return {"success": True, "aborted": tm.abort_matching("" if obj.abort_all else obj.rid)}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics():
        return Response(tm.metrics.render(), media_type="text/plain; version=0.0.4")

    return app
