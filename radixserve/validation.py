"""Pydantic validation errors as one "field.path: reason" line, for 400 answers that name the
field (the HTTP routes, the tool-call spec and the Engine all report errors this way)."""
from __future__ import annotations

import json
import re

_TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list", "none"}
_PLAIN = re.compile(r"[\w\-]+")


def _clean_loc(loc: tuple) -> str:
    """("body", "sampling_params", "list[...]", 0, "top_p") -> "sampling_params.0.top_p"."""
    def is_union_tag(p: object) -> bool:  # pydantic labels union branches by type name
        return isinstance(p, str) and ("[" in p or p in _TYPE_TAGS or p[:1].isupper())

    def component(p: object) -> str:  # a client's dict key may hold anything: keep the path one token
        s = str(p)
        return s if _PLAIN.fullmatch(s) else json.dumps(s).replace(" ", "\\u0020")

    parts = [component(p) for p in loc if p != "body" and not is_union_tag(p)]
    return ".".join(parts) or "body"


def validation_message(errors: list[dict]) -> str:
    """The first error as "field.path: reason"; JSON syntax errors name the body."""
    if not errors:
        return "body: invalid request"
    err = errors[0]
    if err.get("type") == "json_invalid":
        ctx = err.get("ctx") or {}
        return f"body: invalid JSON ({ctx.get('error', err.get('msg'))})"
    if err.get("type") in ("missing", "model_type", "model_attributes_type") and \
            tuple(err.get("loc", ())) in ((), ("body",)):
        return "body: a JSON object is required"
    return f"{_clean_loc(tuple(err.get('loc', ())))}: {err.get('msg', 'invalid value')}"
