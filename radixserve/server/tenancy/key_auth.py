"""Multi-key authentication (``--api-keys-file``): a pure ASGI middleware (safe with streaming).

Every HTTP route but ``open_paths`` needs ``Authorization: Bearer <key>`` of a key in the
live ``KeyStore`` (401 otherwise) that may call the path (403 naming the route otherwise:
``KeySpec.may_call``).  The key is put in ``accounting.current_key`` for the request's task,
where the TokenizerManager's ``submit`` charges it.
"""
from __future__ import annotations

from typing import Any

from radixserve.server.tenancy.accounting import current_key
from radixserve.server.http_utils import error_response
from radixserve.server.tenancy.keys import KeyStore


class KeyAuthMiddleware:
    def __init__(self, app: Any, store: KeyStore, open_paths: tuple[str, ...] = ("/health",)) -> None:
        self.app = app
        self.store = store
        self.open_paths = open_paths

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path in self.open_paths:
            return await self.app(scope, receive, send)
        auth = dict(scope.get("headers") or []).get(b"authorization", b"")
        secret = auth[7:].decode("latin-1").strip() if auth[:7].lower() == b"bearer " else None
        spec = self.store.lookup(secret)
        if spec is None:
            resp = error_response(401, "authorization: missing or invalid API key (use 'Authorization: Bearer <key>')")
            return await resp(scope, receive, send)
        if not spec.may_call(path):
            resp = error_response(403, f"route: {path} is not allowed for key '{spec.name}'")
            return await resp(scope, receive, send)
        token = current_key.set(spec)
        try:
            await self.app(scope, receive, send)
        finally:
            current_key.reset(token)
