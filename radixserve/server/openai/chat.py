"""POST /v1/chat/completions, with tool calling.

Messages are rendered with the model's chat template (chat_encoder.py; ``role: tool`` with
``tool_call_id`` and assistant ``tool_calls`` included, see radixserve/tools/prompt.py for the default
rendering).  ``tools``/``tool_choice``/``parallel_tool_calls`` make a ``ToolPlan``
(radixserve/tools/spec.py): ``required`` and a named function constrain the output with a
``json_schema`` built from the functions' parameters, ``auto`` parses calls from free text
(radixserve/tools/parsers.py).  A choice with calls has ``message.tool_calls`` (``content`` is the text
before the first call, or null) and ``finish_reason: "tool_calls"``; streamed, the calls
come as ``delta.tool_calls`` entries (radixserve/tools/stream.py), and in ``auto`` mode text that may
still become a call marker is held back.  Errors name the field (``tools.0.function.
parameters: ...``, ``tool_choice: ...``, ``messages.2.tool_call_id: ...``).  A text content part
with ``"document": true`` is a document, reusable out of order (chat_encoder.py, radixserve/tokenizer.py).
Reasoning models (``--reasoning-parser``, reasoning.py): ``chat_template_kwargs`` reach the template,
the thinking comes as ``reasoning_content`` apart from ``content`` and a constraint applies after it.
"""
from __future__ import annotations

import time
import uuid
from typing import Any, Optional

from fastapi import APIRouter, Request
from fastapi.responses import Response

from radixserve.tokenizer import Spans
from radixserve.server.http_utils import first_and_rest, parse_body, stream_response
from radixserve.server.lora_routes import apply_model_adapter
from radixserve.server.openai.chat_encoder import DocumentMarks
from radixserve.server.openai.reasoning import ChatReasoning, check_without_parser, template_kwargs
from radixserve.server.openai.routes import ChunkStream, _openai_names, finish_str, sampling_dict, usage
from radixserve.server.openapi_doc import body_doc
from radixserve.server.protocol import ChatCompletionRequest
from radixserve.server.req_state import ReqState, RequestError
from radixserve.tools.parsers import HermesParser, ToolParser, make_parser
from radixserve.tools.spec import ToolPlan, plan_tools, tool_schema_for_check
from radixserve.tools.stream import ToolCallStream, finish_reason


def message_dicts(req: ChatCompletionRequest, marks: Optional[DocumentMarks] = None) -> list[dict[str, Any]]:
    """The request's messages as chat-template dicts, document parts replaced by ``marks``'
    sentinels (when given); RequestError(400) naming the field."""
    out: list[dict[str, Any]] = []
    call_names: dict[str, str] = {}
    for i, m in enumerate(req.messages):
        if isinstance(m.content, list):
            for j, p in enumerate(m.content):
                if p.document and p.type != "text":
                    raise RequestError(400, f"messages.{i}.content.{j}.document: only a text part can be a document")
        d: dict[str, Any] = {"role": m.role, "content": m.text(None if marks is None else marks.mark)}
        if m.tool_calls:
            if m.role != "assistant":
                raise RequestError(400, f"messages.{i}.tool_calls: only assistant messages carry tool calls")
            d["tool_calls"] = [c.model_dump() for c in m.tool_calls]
            call_names.update({c.id: c.function.name for c in m.tool_calls})
        if m.role == "tool":
            if not m.tool_call_id:
                raise RequestError(400, f"messages.{i}.tool_call_id: required for role 'tool'")
            d["tool_call_id"] = m.tool_call_id
            name = m.name or call_names.get(m.tool_call_id)
            if name:
                d["name"] = name
        out.append(d)
    return out


async def constrain_for_tools(tm: Any, plan: ToolPlan, params: dict[str, Any], rsn: Optional[ChatReasoning],
                              parallel_tool_calls: Optional[bool], conflict: Optional[str]) -> Optional[ToolParser]:
    """Shared by the chat and Responses routes: set up ``params`` (mutated) for the reasoning
    parser ``rsn`` and the tool plan (a forced call's JSON schema; with the hermes format and
    ``parallel_tool_calls`` False, a stop after one call) and return the output's tool-call
    parser (None: no tools).  ``conflict``: the request field that already constrains the
    output (a forced tool call cannot be combined with it: RequestError 400 naming it)."""
    if rsn is None:
        check_without_parser(params)
    else:
        rsn.params(params)  # require_reasoning: a constraint below applies after the thinking
    if plan.schema is not None:
        if conflict is not None:
            choice = "'required'" if plan.mode == "required" else "naming a function"
            raise RequestError(400, f"{conflict}: cannot be combined with tool_choice {choice}")
        params["json_schema"] = plan.schema
        return make_parser("json", plan.names)
    if plan.mode != "auto":
        return None
    fmt = await tm.chat.tool_format()
    if fmt == "hermes" and parallel_tool_calls is False:  # one call: stop after it
        stop = params.get("stop") or []
        params["stop"] = [*([stop] if isinstance(stop, str) else stop), HermesParser.close]
    return make_parser(fmt, plan.names)


def chat_router(ctx: Any) -> APIRouter:
    """The chat route over ``ctx`` (the app's ``ServerContext``)."""
    tm = ctx.tm
    router = APIRouter()

    def build(ids: list[int], params: dict, rid: Optional[str], top: Optional[int], spans: Optional[Spans]) -> list:
        return tm.build([ids], [params], ["messages"], None if rid is None else [rid], top is not None, -1, top or 0,
                        doc_spans=None if spans is None else [spans])

    def submit(req: ChatCompletionRequest, plan: ToolPlan, ids: list[int], params: dict, top: Optional[int],
               spans: Optional[Spans] = None):
        try:
            return tm.submit(build(ids, params, req.rid, top, spans))
        except RequestError as e:
            if plan.schema is None or "json_schema" not in e.message:
                raise _openai_names(e) from None
        for i, tool in enumerate(req.tools or []):  # name the tool whose schema does not compile
            if plan.mode == "named" and tool.function.name != req.tool_choice.function.name:
                continue
            try:
                build(ids, {**params, "json_schema": tool_schema_for_check(req.tools, i)}, None, None, spans)
            except RequestError as e:
                reason = e.message.split("json_schema: ", 1)[-1]
                raise RequestError(400, f"tools.{i}.function.parameters: {reason}") from None
        raise RequestError(400, "tools: the functions' schemas cannot be combined into one constraint")

    def lp_entry(tid: int, lp: float) -> dict[str, Any]:
        s = tm.token_text(tid)
        return {"token": s, "logprob": lp, "bytes": list(s.encode("utf-8"))}

    def chat_logprobs(st: ReqState, start: int, top: int) -> dict:
        return {"content": [{**lp_entry(t.token_id, t.logprob),
                             "top_logprobs": [lp_entry(i, v) for v, i in (t.top or [])[:top]]}
                            for t in st.output_logprobs[start:]]}

    async def respond(req: ChatCompletionRequest, states: list[ReqState], request: Request, top: Optional[int],
                      parser: Optional[ToolParser], rsn: Optional[ChatReasoning]):
        base = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": req.model or ctx.model_name}
        streams = {st.index: ToolCallStream(parser) for st in states} if parser is not None else {}
        if rsn is not None and not rsn.separate:
            rsn = None  # separate_reasoning false: the thinking stays in content
        if not req.stream:
            if not await tm.run_to_end(states, request.is_disconnected):
                return Response(status_code=499)
            choices = []
            for st in states:
                reasoning, text = (None, st.text) if rsn is None else rsn.split(st.text)
                msg: dict[str, Any] = {"role": "assistant", "content": text or (None if reasoning else text)}
                if rsn is not None:
                    msg["reasoning_content"] = reasoning
                reason = finish_str(st)
                if parser is not None:
                    msg["content"], calls = streams[st.index].message(text)
                    if calls:
                        msg["tool_calls"] = calls
                    reason = finish_reason(reason, bool(calls))
                choices.append({"index": st.index, "message": msg, "finish_reason": reason,
                                "logprobs": None if top is None else chat_logprobs(st, 0, top)})
            return {**base, "object": "chat.completion", "choices": choices, "usage": usage(states, req.n)}

        chunks = ChunkStream(req, base, "chat.completion.chunk")
        sent_text = {st.index: 0 for st in states}
        sent_lp = {st.index: 0 for st in states}
        started: set[int] = set()
        thoughts = {st.index: rsn.stream() for st in states} if rsn is not None else {}

        def render(st: ReqState) -> list:
            i, reason = st.index, finish_str(st)
            tool_deltas: list = []
            # the thinking since the last chunk, and the answer so far (the whole text without a parser)
            thought, text = thoughts[i].step(st.text, reason is not None) if thoughts else ("", st.text)
            if parser is not None:
                content, tool_deltas = streams[i].step(text, reason is not None)
                reason = finish_reason(reason, streams[i].called)
            else:
                content = text[sent_text[i]:]
            if not content and not tool_deltas and not thought and reason is None and i in started:
                return []
            delta: dict[str, Any] = {} if i in started else {"role": "assistant"}
            if thought:
                delta["reasoning_content"] = thought
            if content or not thought and (parser is None or not tool_deltas and i not in started):
                delta["content"] = content
            if tool_deltas:
                delta["tool_calls"] = tool_deltas
            started.add(i)
            c = {"index": i, "delta": delta, "finish_reason": reason,
                 "logprobs": None if top is None else chat_logprobs(st, sent_lp[i], top)}
            sent_text[i], sent_lp[i] = len(text), len(st.output_logprobs)
            return chunks.chunk(c)

        def tail() -> list:
            return chunks.tail(states, req.n)

        first, events = await first_and_rest(tm.events(states, request.is_disconnected))
        return stream_response(first, events, render, tail)

    @router.post("/v1/chat/completions", openapi_extra=body_doc(ChatCompletionRequest, stream=True))
    async def chat(request: Request):
        req = await parse_body(request, ChatCompletionRequest)
        try:
            plan = plan_tools(req.tools, req.tool_choice, req.parallel_tool_calls)
        except ValueError as e:
            raise RequestError(400, str(e)) from None
        spans, kw = None, template_kwargs(req)
        if any(m.has_documents() for m in req.messages):  # documents: rendered around sentinels (chat_encoder.py)
            marks = DocumentMarks()
            ids, spans = await tm.chat.encode_documents(message_dicts(req, marks), plan.tools, marks,
                                                        req.continue_final_message, template_kwargs=kw)
        else:
            ids = await tm.chat.encode(message_dicts(req), plan.tools, req.continue_final_message, template_kwargs=kw)
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        if max_tokens is not None and max_tokens < 0:  # named as sent (the builder would say max_tokens)
            field = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
            raise RequestError(400, f"{field}: must be >= 0 (got {max_tokens})")
        params = sampling_dict(req, max_tokens, tm.info.context_len)
        apply_model_adapter(ctx, req.model, params)
        rsn = ChatReasoning.of(ctx.engine_cfg.scheduler.reasoning_parser, req)
        conflict = next((f for k, f in (("json_schema", "response_format"), ("regex", "regex")) if k in params), None)
        parser = await constrain_for_tools(tm, plan, params, rsn, req.parallel_tool_calls, conflict)
        top = (req.top_logprobs or 0) if req.logprobs else None
        states = submit(req, plan, ids, params, top, spans)
        return await respond(req, states, request, top, parser, rsn)

    return router
