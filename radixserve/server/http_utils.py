"""HTTP plumbing shared by the native and OpenAI routes: error bodies, SSE streams, API-key check.

Every error is OpenAI's error object ``{"error": {message, type, param, code}}`` where
``param`` is the field the message names ("sampling_params.top_p: ...").
"""
from __future__ import annotations

import json
from typing import Any, AsyncIterator, Callable, Optional, TypeVar

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from radixserve.validation import validation_message
from radixserve.server.req_state import RequestError

M = TypeVar("M", bound=BaseModel)

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 429: "rate_limit_error", 503: "service_unavailable",
                500: "internal_server_error"}


def error_body(status: int, message: str) -> dict[str, Any]:
    param = message.split(":", 1)[0] if ":" in message and " " not in message.split(":", 1)[0] else None
    return {"error": {"message": message, "type": _ERROR_TYPES.get(status, "invalid_request_error"),
                      "param": param, "code": status}}


def error_response(status: int, message: str, headers: Optional[dict[str, str]] = None) -> JSONResponse:
    return JSONResponse(error_body(status, message), status_code=status, headers=headers)


def sse(obj: Any) -> str:
    return "data: " + json.dumps(obj, ensure_ascii=False) + "\n\n"


SSE_DONE = "data: [DONE]\n\n"

# How long the server keeps an idle HTTP connection open.  A client that pools connections
# (the router) must drop its idle ones sooner: at equal timeouts a request sent on a pooled
# connection can meet the server's close and fail with a ReadError, though the server never read it.
SERVER_KEEP_ALIVE_S = 5.0


async def parse_body(request: Request, model: type[M]) -> M:
    """The JSON body as ``model`` whatever the Content-Type; RequestError(400) names the field (an
    unknown top-level one with the closest known name, when one is close).  Types are strict (no "5" for an int, no 1 for a bool), as the OpenAPI document states."""
    raw = await request.body()
    try:  # pydantic's own JSON parser: bounded nesting, no Python recursion; strict types
        return model.model_validate_json(raw or b"null", strict=True)
    except ValidationError as e:
        known = [f.alias or name for name, f in model.model_fields.items()]
        raise RequestError(400, validation_message(list(e.errors()), known)) from None


async def first_and_rest(events: AsyncIterator[Any]):
    """Await the first event (so errors before it become HTTP errors); return it and the iterator."""
    try:
        return await events.__anext__(), events
    except StopAsyncIteration:
        return None, events


def stream_response(first: Optional[Any], events: AsyncIterator[Any], render: Callable[[Any], list],
                    tail: Optional[Callable[[], list]] = None) -> StreamingResponse:
    """SSE of the chunks ``render(state)`` returns for every event, then ``tail()``'s
    chunks, then [DONE]."""

    async def body():
        try:
            item = first
            while item is not None:
                for chunk in render(item):
                    yield sse(chunk)
                item = await events.__anext__()
        except StopAsyncIteration:
            pass
        except RequestError as e:
            yield sse(error_body(e.status, e.message))
        finally:
            # A client disconnect cancels this task, and anyio re-cancels every later await;
            # shield the close so the events' cleanup (which aborts the requests) runs.
            with anyio.CancelScope(shield=True):
                await events.aclose()
        for chunk in tail() if tail else []:
            yield sse(chunk)
        yield SSE_DONE

    return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(400, validation_message(list(exc.errors())))

    @app.exception_handler(StarletteHTTPException)
    async def _routing(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # no such route (404) or method (405): the error object too, naming the path or the method
        name = "method" if exc.status_code == 405 else "path"
        return error_response(exc.status_code, f"{name}: {exc.detail} ({request.method} {request.url.path})",
                              getattr(exc, "headers", None))

    @app.exception_handler(RequestError)
    async def _request_error(_: Request, exc: RequestError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.headers)

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}")


class APIKeyMiddleware:
    """Pure ASGI middleware (safe with streaming): every HTTP route except /health needs
    ``Authorization: Bearer <api_key>``."""

    def __init__(self, app: Any, api_key: str, open_paths: tuple[str, ...] = ("/health",)) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()
        self.open_paths = open_paths

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("path") in self.open_paths:
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        if headers.get(b"authorization") != self.expected:
            resp = error_response(401, "authorization: missing or invalid API key (use 'Authorization: Bearer <key>')")
            return await resp(scope, receive, send)
        return await self.app(scope, receive, send)
