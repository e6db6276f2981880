"""POST /v1/embeddings (the OpenAI API) over the served causal LM.

``input`` is a string, a list of strings, a list of token ids or a list of token-id lists;
each becomes one prefill-only request whose final hidden state (after the final norm) is
pooled: by the last token or the mean over all tokens (the server's ``--embedding-pooling``,
default "last", or the request's ``pooling`` extension), then L2-normalized unless the
request says ``normalize: false`` (an extension).  ``encoding_format`` "base64" (what the
official ``openai`` package asks for) is the little-endian float32 bytes, base64-encoded.
``dimensions`` must be absent or the model's hidden size (no truncation); ``user`` is
accepted and ignored.  Bad input gets a 400 naming the field (``input.2: ...``), an unknown field
too; ``model`` is checked as on the other OpenAI routes (``lora_routes.adapter_of_model``: a 404
for a name the server does not serve, a 400 for an adapter's).
"""
from __future__ import annotations

import base64
from typing import Annotated, Any, Literal, Optional

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, WithJsonSchema

from radixserve.embedding import finalize
from radixserve.server.http_utils import parse_body
from radixserve.server.lora_routes import adapter_of_model
from radixserve.server.openapi_doc import body_doc
from radixserve.server.req_state import RequestError


# checked by hand (parse_input) so errors name the element (input.2); the schema says what is taken
_INPUT_SCHEMA = {"anyOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": {"anyOf": [
    {"type": "string"}, {"type": "integer"}, {"type": "array", "items": {"type": "integer"}}]}}]}


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")  # the names: server/openai_fields.py
    input: Annotated[Any, WithJsonSchema(_INPUT_SCHEMA)]
    model: Optional[str] = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Optional[int] = None
    user: Optional[str] = None
    pooling: Optional[Literal["last", "mean"]] = None  # extension: overrides --embedding-pooling
    normalize: bool = True  # extension: False returns the raw pooled hidden state


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _token_list(x: Any, name: str) -> list[int]:
    if not isinstance(x, list) or not all(_is_int(t) for t in x):
        raise RequestError(400, f"{name}: must be a string or a list of token ids")
    return list(x)


def parse_input(value: Any, encode: Any) -> tuple[list[list[int]], list[str]]:
    """(token-id prompts, field names) of an ``input``; RequestError(400) naming the field.
    Emptiness and the token range are checked by the ``RequestBuilder``."""
    if isinstance(value, str):
        return [encode(value)], ["input"]
    if not isinstance(value, list):
        raise RequestError(400, "input: must be a string, a list of strings, a list of token ids "
                                "or a list of token-id lists")
    if not value:
        raise RequestError(400, "input: the list is empty")
    if all(_is_int(t) for t in value):
        return [list(value)], ["input"]
    names = [f"input.{i}" for i in range(len(value))]
    return [encode(x) if isinstance(x, str) else _token_list(x, n) for x, n in zip(value, names)], names


def encode_vector(vec: list[float], fmt: str) -> Any:
    if fmt == "base64":
        import numpy as np  # here: the server's start does without numpy

        return base64.b64encode(np.asarray(vec, dtype="<f4").tobytes()).decode("ascii")
    return vec


def embeddings_router(ctx: Any) -> APIRouter:
    """The /v1/embeddings route over ``ctx`` (the app's ``ServerContext``)."""
    tm = ctx.tm
    router = APIRouter()

    @router.post("/v1/embeddings", openapi_extra=body_doc(EmbeddingRequest))
    async def embeddings(request: Request):
        req = await parse_body(request, EmbeddingRequest)
        if adapter_of_model(ctx, req.model) is not None:  # an unknown name: a 404 (lora_routes.py)
            raise RequestError(400, f"model: {req.model!r} is a LoRA adapter; embeddings are the base model's")
        hidden = tm.info.hidden_size
        if req.dimensions is not None and req.dimensions != hidden:
            raise RequestError(400, f"dimensions: this model's embeddings have {hidden} dimensions "
                                    f"(got {req.dimensions}; truncation is not supported)")
        prompts, names = parse_input(req.input, tm.encode)
        try:
            reqs = tm.builder.build_embed(prompts, names, req.pooling or ctx.engine_cfg.model.embedding_pooling)
        except ValueError as e:
            raise RequestError(400, str(e)) from None
        states = tm.submit(reqs)
        if not await tm.run_to_end(states, request.is_disconnected):
            return Response(status_code=499)
        data = []
        for st in states:
            if st.embedding is None:
                raise RequestError(500, f"input: request {st.rid} ended without an embedding ({st.finish_reason})")
            vec = finalize(st.embedding, req.normalize)
            data.append({"object": "embedding", "index": st.index, "embedding": encode_vector(vec, req.encoding_format)})
        tokens = sum(len(st.input_ids) for st in states)
        return {"object": "list", "data": data, "model": req.model or ctx.model_name,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    return router
