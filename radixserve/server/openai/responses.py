"""/v1/responses: OpenAI's Responses API (``client.responses.create`` / ``stream`` / ``retrieve`` / ``delete``).

POST renders the conversation -- the stored items of ``previous_response_id``'s conversation (its
inputs and outputs, responses_store.py), then ``input`` -- with the chat route's template and tool
rendering (responses_items.py), so a continued conversation's prompt starts with the earlier one and
the radix cache serves that prefix (``usage.input_tokens_details.cached_tokens``).  ``instructions``
apply to this request only (as OpenAI's): give them again to keep the prefix.  ``tools`` /
``tool_choice`` are planned as chat's (``required`` and a named function are constraints, ``auto``
parses calls from the text); ``text.format`` (``json_object`` / ``json_schema``) is chat's
``response_format``; with ``--reasoning-parser`` the thinking is a ``reasoning`` item and a constraint
applies after it (``reasoning.effort: "none"`` turns thinking off where the template has a switch).
A response cut by ``max_output_tokens`` is ``status: "incomplete"`` (streamed: ``response.incomplete``
ends the stream, as OpenAI's).  ``store`` (default true) keeps the response; ``store: false`` ones are
not retrievable nor continuable.  GET / DELETE ``/v1/responses/{id}``: an unknown id is a 404 naming it.
Streaming events: responses_events.py; every event is an SSE ``event:`` + ``data:`` pair, and the
stream ends with ``data: [DONE]`` as the other OpenAI routes' do.  An unknown
field is a 400 naming it (openai_fields.py), an unknown ``model`` a 404 as on the other routes.
"""
from __future__ import annotations

import json
import time
import types
from typing import Any, Optional

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from radixserve.reasoning.formats import reasoning_format, think_token_ids
from radixserve.server.http_utils import SSE_DONE, first_and_rest, parse_body
from radixserve.server.lora_routes import apply_model_adapter
from radixserve.server.openai.chat import constrain_for_tools
from radixserve.server.openai.reasoning import ChatReasoning, template_kwargs
from radixserve.server.openai.responses_events import OutputBuilder
from radixserve.server.openai.responses_items import (chat_messages, chat_tool_choice, chat_tools, format_schema,
                                                      input_items, new_id)
from radixserve.server.openai.responses_protocol import SAMPLING_FIELDS, ResponsesRequest
from radixserve.server.openai.responses_store import ResponseStore
from radixserve.server.openapi_doc import body_doc
from radixserve.server.req_state import ReqState, RequestError
from radixserve.server.tenancy.accounting import current_key
from radixserve.tools.spec import plan_tools

_RENAMES = {"sampling_params.max_new_tokens": "max_output_tokens", "sampling_params.json_schema": "text.format",
            "sampling_params.": ""}


def _refuse_unsupported(req: ResponsesRequest) -> None:
    if req.background:
        raise RequestError(400, "background: background responses are not supported (omit it, or set it false)")
    if req.conversation is not None:
        raise RequestError(400, "conversation: conversations are not supported (continue with previous_response_id)")
    if req.prompt is not None:
        raise RequestError(400, "prompt: saved prompts are not supported (give input and instructions)")
    if req.truncation == "auto":
        raise RequestError(400, "truncation: only 'disabled' is supported (an overlong conversation is refused)")
    if req.max_output_tokens is not None and req.max_output_tokens < 0:
        raise RequestError(400, f"max_output_tokens: must be >= 0 (got {req.max_output_tokens})")


def _status(st: ReqState) -> str:
    """A finished output's response status: ``incomplete`` when cut by the token limit."""
    return "incomplete" if (st.finish_reason or {}).get("type") == "length" else "completed"


def sse_event(event: dict[str, Any]) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"


def responses_router(ctx: Any) -> APIRouter:
    """The Responses routes over ``ctx`` (the app's ``ServerContext``); stored responses live in
    ``--usage-db``'s file when set, else in memory (responses_store.py)."""
    tm = ctx.tm
    store = ResponseStore(ctx.server_cfg.usage_db)
    parser_name: str = ctx.engine_cfg.scheduler.reasoning_parser
    router = APIRouter()

    def owner() -> str:
        spec = current_key.get()
        return spec.name if spec is not None else ""

    def stored(rid: str, field: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        found = store.get(rid, owner())
        if found is None:
            raise RequestError(404, f"{field}: no stored response with id `{rid}` (deleted, stored with "
                                    f"store: false, or never made)")
        return found

    def reasoning_of(req: ResponsesRequest) -> tuple[Optional[ChatReasoning], Optional[dict[str, Any]]]:
        kw = dict(req.chat_template_kwargs or {})
        if parser_name != "none" and req.reasoning is not None and req.reasoning.effort == "none":
            switch = reasoning_format(parser_name).switch
            if switch:
                kw.setdefault(switch, False)
        shim = types.SimpleNamespace(chat_template_kwargs=kw or None, separate_reasoning=True)
        return ChatReasoning.of(parser_name, shim), template_kwargs(shim)

    def reasoning_tokens(st: ReqState, thought: Optional[str]) -> int:
        if thought is None:
            return 0
        end = think_token_ids(reasoning_format(parser_name), tm.tokenizer)[1]
        return st.output_ids.index(end) + 1 if end in st.output_ids else len(st.output_ids)

    def response_obj(req: ResponsesRequest, rid: str, created: int, status: str, output: list[dict[str, Any]],
                     usage: Optional[dict[str, Any]]) -> dict[str, Any]:
        fmt = req.text.format.model_dump(by_alias=True, exclude_none=True) if req.text and req.text.format else \
            {"type": "text"}
        choice = req.tool_choice.model_dump() if hasattr(req.tool_choice, "model_dump") else \
            req.tool_choice or ("auto" if req.tools else "none")
        return {"id": rid, "object": "response", "created_at": created, "status": status,
                "completed_at": int(time.time()) if status == "completed" else None, "error": None,
                "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
                "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
                "model": req.model or ctx.model_name, "output": output,
                "parallel_tool_calls": req.parallel_tool_calls is not False,
                "previous_response_id": req.previous_response_id,
                "reasoning": req.reasoning.model_dump(exclude_none=True) if req.reasoning else None,
                "store": req.store is not False, "temperature": req.temperature, "top_p": req.top_p,
                "text": {"format": fmt}, "tool_choice": choice,
                "tools": [t.model_dump(exclude_none=True) for t in req.tools or []], "truncation": "disabled",
                "usage": usage, "user": req.user, "metadata": req.metadata or {}}

    def finish(req: ResponsesRequest, st: ReqState, b: OutputBuilder, rid: str, created: int,
               conversation: list[dict[str, Any]]) -> dict[str, Any]:
        """The finished response (stored unless ``store`` is false)."""
        status = _status(st)
        inp, out = len(st.input_ids), len(st.output_ids)
        usage = {"input_tokens": inp, "input_tokens_details": {"cached_tokens": st.cached_tokens,
                                                                "cache_write_tokens": inp - st.cached_tokens},
                 "output_tokens": out, "output_tokens_details": {"reasoning_tokens": reasoning_tokens(st, b.reasoning_text)},
                 "total_tokens": inp + out}
        resp = response_obj(req, rid, created, status, b.items, usage)
        if req.store is not False:
            store.put(resp, conversation + b.items, owner())
        return resp

    @router.post("/v1/responses", openapi_extra=body_doc(ResponsesRequest, stream=True))
    async def create(request: Request):
        req = await parse_body(request, ResponsesRequest)
        _refuse_unsupported(req)
        earlier = stored(req.previous_response_id, "previous_response_id")[1] if req.previous_response_id else []
        conversation = earlier + input_items(req)
        messages = chat_messages(conversation, req.instructions, len(earlier))
        try:
            plan = plan_tools(chat_tools(req.tools), chat_tool_choice(req.tool_choice), req.parallel_tool_calls)
        except ValueError as e:
            raise RequestError(400, str(e).replace(".function.", ".")) from None
        rsn, kw = reasoning_of(req)
        try:
            ids = await tm.chat.encode(messages, plan.tools, template_kwargs=kw)
        except RequestError as e:  # the chat encoder names chat's field
            raise RequestError(e.status, e.message.replace("messages: ", "input: ", 1)) from None
        params: dict[str, Any] = {name: getattr(req, name) for name in SAMPLING_FIELDS if getattr(req, name) is not None}
        params["max_new_tokens"] = tm.info.context_len if req.max_output_tokens is None else req.max_output_tokens
        schema = format_schema(req)
        if schema is not None:
            params["json_schema"] = schema
        apply_model_adapter(ctx, req.model, params)
        parser = await constrain_for_tools(tm, plan, params, rsn, req.parallel_tool_calls,
                                           "text.format" if schema is not None else None)
        try:
            states = tm.submit(tm.build([ids], [params], ["input"], None))
        except RequestError as e:
            msg = e.message
            if plan.schema is not None:  # the constraint is the tools' (a parameters schema that does not compile)
                msg = msg.replace("sampling_params.json_schema", "tools")
            for old, new in _RENAMES.items():
                msg = msg.replace(old, new)
            raise RequestError(e.status, msg, e.headers) from None
        b, rid, created = OutputBuilder(parser, rsn), new_id("resp"), int(time.time())
        if not req.stream:
            if not await tm.run_to_end(states, request.is_disconnected):
                return Response(status_code=499)
            st = states[0]
            b.step(st.text, True, _status(st))
            return finish(req, st, b, rid, created, conversation)

        started = response_obj(req, rid, created, "in_progress", [], None)
        b.emit("response.created", response=started)
        b.emit("response.in_progress", response=started)
        first, events = await first_and_rest(tm.events(states, request.is_disconnected))

        async def body():
            for e in b.take():
                yield sse_event(e)
            st, item = states[0], first
            try:
                while item is not None:
                    final = st.finish_reason is not None
                    b.step(st.text, final, _status(st))
                    for e in b.take():
                        yield sse_event(e)
                    item = None if final else await events.__anext__()
            except StopAsyncIteration:
                pass
            except RequestError as e:
                b.emit("error", code=str(e.status), message=e.message, param=None)
                failed = response_obj(req, rid, created, "failed", b.items, None)
                failed["error"] = {"code": "server_error", "message": e.message}
                b.emit("response.failed", response=failed)
            finally:
                with anyio.CancelScope(shield=True):
                    await events.aclose()
            if st.finish_reason is not None and st.error is None:
                resp = finish(req, st, b, rid, created, conversation)
                b.emit("response.completed" if resp["status"] == "completed" else "response.incomplete", response=resp)
            for e in b.take():
                yield sse_event(e)
            yield SSE_DONE  # as the other OpenAI routes end (the openai client stops reading there)

        return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    @router.get("/v1/responses/{response_id}")
    async def retrieve(response_id: str, stream: bool = False):
        """The stored response ``response_id``."""
        if stream:
            raise RequestError(400, "stream: a stored response is returned whole (omit stream)")
        return stored(response_id, "response_id")[0]

    @router.delete("/v1/responses/{response_id}")
    async def delete(response_id: str):
        """Forget the stored response ``response_id`` (later continuations of it are a 404)."""
        if not store.delete(response_id, owner()):
            raise RequestError(404, f"response_id: no stored response with id `{response_id}`")
        return {"id": response_id, "object": "response", "deleted": True}

    return router
