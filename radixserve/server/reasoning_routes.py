"""SGLang's ``POST /separate_reasoning``: split a text into its reasoning and its answer.

Body ``{"text": str, "reasoning_parser": str}`` (``reasoning_parser`` defaults to the server's
``--reasoning-parser``); answer ``{"text": <the answer>, "reasoning_text": <the thinking>}``, as
SGLang's route answers.  The text is taken as SGLang's parser of that name takes it without a
request: ``deepseek-r1`` and ``qwen3-thinking`` start thinking, ``qwen3`` and ``deepseek-v3`` only
after a leading ``<think>`` (radixserve/reasoning/).
"""
from __future__ import annotations

from typing import Any, Optional

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict

from radixserve.reasoning.formats import reasoning_format
from radixserve.reasoning.split import split_reasoning
from radixserve.server.http_utils import parse_body
from radixserve.server.openapi_doc import body_doc
from radixserve.server.req_state import RequestError


class SeparateReasoningReqInput(BaseModel):
    """POST /separate_reasoning (SGLang's body)."""

    model_config = ConfigDict(extra="forbid")
    text: str
    reasoning_parser: Optional[str] = None


def reasoning_router(ctx: Any) -> APIRouter:
    """The route over ``ctx`` (the app's ``ServerContext``)."""
    router = APIRouter()

    @router.post("/separate_reasoning", openapi_extra=body_doc(SeparateReasoningReqInput))
    async def separate_reasoning(request: Request):
        obj = await parse_body(request, SeparateReasoningReqInput)
        name = obj.reasoning_parser or ctx.engine_cfg.scheduler.reasoning_parser
        if name == "none":
            raise RequestError(400, "reasoning_parser: required (this server has no --reasoning-parser)")
        try:
            fmt = reasoning_format(name)
        except ValueError as e:
            raise RequestError(400, str(e)) from None
        reasoning, text = split_reasoning(obj.text, fmt, fmt.forced)
        return {"text": text, "reasoning_text": reasoning or ""}

    return router
