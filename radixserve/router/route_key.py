"""The text a request is routed by: what its prompt starts with, as the replica will see it.

Only the prompt matters (the replica's radix tree is keyed by prompt tokens), so the key is
the prompt text, the chat messages' roles and contents in order, or the token ids (each id
one character, behind a marker that no text starts with).  A body the router cannot read
gives "" (routed by load; the replica answers it with its own 4xx).
"""
from __future__ import annotations

import json
from typing import Any

_IDS = "\x00ids\x00"


def ids_key(ids: list[Any]) -> str:
    out = []
    for i in ids:
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < 0x110000:
            break
        out.append(chr(i))
    return _IDS + "".join(out)


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _first(x: Any) -> Any:
    """A batch's first prompt (a batch goes to one replica)."""
    return x[0] if isinstance(x, list) and x and isinstance(x[0], (str, list)) else x


def parse_request(path: str, body: bytes) -> tuple[str, bool]:
    """(routing text, whether the client asked for a stream)."""
    try:
        obj = json.loads(body) if body else None
    except (ValueError, RecursionError):
        return "", False
    if not isinstance(obj, dict):
        return "", False
    return routing_text(path, obj), obj.get("stream") is True


def routing_text(path: str, obj: dict[str, Any]) -> str:
    if path.endswith("/chat/completions"):
        msgs = obj.get("messages")
        if not isinstance(msgs, list):
            return ""
        return "".join(f"<{m.get('role')}>{_content_text(m.get('content'))}" for m in msgs if isinstance(m, dict))
    for field in ("text", "prompt", "input"):  # /generate, /v1/completions, /v1/embeddings
        if field in obj:
            value = _first(obj[field])
            if isinstance(value, str):
                return value
            if isinstance(value, list):
                return ids_key(value)
            return ""
    if "input_ids" in obj:
        value = _first(obj["input_ids"])
        return ids_key(value) if isinstance(value, list) else ""
    return ""
