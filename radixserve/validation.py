"""Pydantic validation errors as one "field.path: reason" line, for 400 answers that name the
field (the HTTP routes, the tool-call spec and the Engine all report errors this way)."""
from __future__ import annotations

import difflib
import json
import re
from typing import Iterable

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


def _unknown(name: str, known: Iterable[str]) -> str:
    """The reason for an unknown field ``name``, with the closest of ``known`` when one is close."""
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.75)
    return f"unknown field (did you mean {close[0]!r}?)" if close else "unknown field"


def validation_message(errors: list[dict], known: Iterable[str] = ()) -> str:
    """The first error as "field.path: reason", an unknown field first (in a union, the branch
    that has it is the one meant); JSON syntax errors name the body.  ``known``: the top-level
    names, for the suggestion an unknown top-level field gets."""
    if not errors:
        return "body: invalid request"
    err = next((e for e in errors if e.get("type") == "extra_forbidden"), errors[0])
    loc = tuple(err.get("loc", ()))
    if err.get("type") == "extra_forbidden":
        return f"{_clean_loc(loc)}: {_unknown(str(loc[-1]), known if len(loc) == 1 else ())}"
    if err.get("type") == "json_invalid":
        ctx = err.get("ctx") or {}
        return f"body: invalid JSON ({ctx.get('error', err.get('msg'))})"
    if err.get("type") in ("missing", "model_type", "model_attributes_type") and \
            tuple(err.get("loc", ())) in ((), ("body",)):
        return "body: a JSON object is required"
    return f"{_clean_loc(tuple(err.get('loc', ())))}: {err.get('msg', 'invalid value')}"
