"""The server's OpenAPI document: request bodies and error answers as the routes really take them.

The routes read their JSON bodies themselves (``http_utils.parse_body``: any Content-Type,
a 400 naming the field), so FastAPI cannot see their models.  A route declares its body
with ``openapi_extra=body_doc(Model)``; ``install_openapi`` then hoists each body schema and
its ``$defs`` into ``components/schemas`` and gives every operation the answers the server
really sends: the error object (``ErrorBody``) for 400 and the other 4xx, and 503 when the
server is busy or unhealthy, instead of FastAPI's 422.  Streaming routes
(``body_doc(M, stream=True)``) declare ``text/event-stream`` besides JSON.
"""
from __future__ import annotations

from typing import Any, Optional

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

REF = "#/components/schemas/{model}"


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: Optional[str] = None  # the field the message names
    code: int


class ErrorBody(BaseModel):
    """Every error answer: ``{"error": {message, type, param, code}}``."""

    error: ErrorDetail


def body_doc(model: type[BaseModel], stream: bool = False) -> dict[str, Any]:
    """``openapi_extra`` of a route whose JSON body is ``model`` (and that streams SSE when
    ``stream``: each event's data is a JSON chunk or ``[DONE]``, so its schema is open)."""
    schema = model.model_json_schema(ref_template=REF)
    extra: dict[str, Any] = {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}
    if stream:
        extra["responses"] = {"200": {"description": "JSON, or with stream: true an SSE stream ending "
                                                     "'data: [DONE]' (errors after the first chunk are "
                                                     "'data: {\"error\": ...}' events)",
                                      "content": {"application/json": {"schema": {}},
                                                  "text/event-stream": {"schema": {}}}}}
    return extra


def _error_response(description: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {"schema": {"$ref": REF.format(model="ErrorBody")}}}}


def _hoist(schema: dict[str, Any], components: dict[str, Any]) -> dict[str, Any]:
    """Move ``schema`` (named by its title) and its ``$defs`` into ``components``; return a $ref."""
    schema = dict(schema)
    components.update(schema.pop("$defs", {}))
    name = schema.get("title")
    if not name:
        return schema
    components[name] = schema
    return {"$ref": REF.format(model=name)}


def build_openapi(app: FastAPI) -> dict[str, Any]:
    """The document of ``app``'s routes, with the fixes described in the module docstring."""
    doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
    components = doc.setdefault("components", {}).setdefault("schemas", {})
    components.pop("HTTPValidationError", None)
    components.pop("ValidationError", None)
    _hoist(ErrorBody.model_json_schema(ref_template=REF), components)
    for path_item in doc.get("paths", {}).values():
        for op in path_item.values():
            body = op.get("requestBody", {}).get("content", {}).get("application/json")
            if body and "schema" in body:
                body["schema"] = _hoist(body["schema"], components)
            responses = op.setdefault("responses", {})
            responses.pop("422", None)
            responses.setdefault("400", _error_response("Bad input: the message names the field"))
            responses.setdefault("4XX", _error_response("Refused (401 key, 403 not allowed, 404, 413 too "
                                                        "large, 429 budget, 499 client gone)"))
            responses.setdefault("503", _error_response("Busy (queue full) or unhealthy"))
    return doc


def install_openapi(app: FastAPI) -> None:
    """Serve ``build_openapi(app)`` (built once, on first request) at /openapi.json."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build_openapi(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
