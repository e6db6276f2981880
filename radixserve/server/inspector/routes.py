"""The radix-cache inspector: ``GET /cache/tree``, ``GET /cache/stats`` and the ``/dashboard`` page.

The scheduler owns the tree; these routes ask it through ``ControlReq`` ("cache_tree",
"cache_stats") and get token ids, never text.  Text previews are decoded here, only with
``--cache-inspector-text`` (prompts are private), and the scheduler never sends ids of a
salted node, so a tenant's text cannot show.

Access: with ``--api-keys-file`` only admin keys reach the JSON routes (they are in
``keys.ADMIN_PATHS``, and checked here again); with ``--api-key`` that key; otherwise they are
open, like ``/metrics``.  The page and its scripts (``DASHBOARD_PATHS``) are static files that
hold no data, so they are served without a key: the page sends the key it is given (URL
fragment ``#key=...``, which browsers never send to the server, or a form) as a bearer header
to the JSON routes.  Docs: docs/INSPECTOR.md.
"""
from __future__ import annotations

from importlib import resources
from typing import Any, Callable

from fastapi import APIRouter, Query
from fastapi.responses import Response

from radixserve.server.tenancy.accounting import current_key
from radixserve.server.inspector.models import ERROR_RESPONSES, CacheStatsReply, CacheTree
from radixserve.server.req_state import RequestError

ASSETS = {"dashboard.css": "text/css; charset=utf-8", "dashboard.js": "text/javascript; charset=utf-8",
          "charts.js": "text/javascript; charset=utf-8", "icicle.js": "text/javascript; charset=utf-8",
          "tree_view.js": "text/javascript; charset=utf-8"}
DASHBOARD_PATHS = ("/dashboard", *(f"/dashboard/{name}" for name in ASSETS))
_HEADERS = {"Cache-Control": "no-cache", "Referrer-Policy": "no-referrer", "X-Content-Type-Options": "nosniff",
            "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                                       "img-src 'self' data:; connect-src 'self'; base-uri 'none'; "
                                       "form-action 'none'; frame-ancestors 'none'"}
MAX_DEPTH, MAX_NODES = 64, 2000


def _asset(name: str) -> bytes:
    return (resources.files("radixserve.server.inspector") / "dashboard" / name).read_bytes()


def add_previews(root: dict[str, Any], decode: Callable[[list[int]], str], enabled: bool) -> None:
    """Replace each node's ``token_ids`` by its decoded ``text`` (only when ``enabled``;
    otherwise drop them).  Mutates the tree in place."""
    stack = [root]
    while stack:
        node = stack.pop()
        ids, truncated = node.pop("token_ids", None), node.pop("token_ids_truncated", False)
        if enabled and ids is not None:
            node["text"], node["text_truncated"] = decode(ids), truncated
        stack.extend(node["children"])


def inspector_router(ctx: Any) -> APIRouter:
    """The inspector's routes over ``ctx`` (the app's ``ServerContext``)."""
    router = APIRouter(tags=["cache inspector"])
    tm, with_text = ctx.tm, bool(ctx.server_cfg.cache_inspector_text)
    pages = {name: _asset(name) for name in ("dashboard.html", *ASSETS)}

    def require_admin() -> None:
        spec = current_key.get()
        if ctx.keys is not None and not (spec is not None and spec.admin):
            raise RequestError(403, "authorization: the cache inspector needs an admin key")

    async def ask(kind: str, **args: Any) -> dict[str, Any]:
        reply = await tm.control(kind, args=args)
        if not isinstance(reply, dict) or "error" in reply:
            raise RequestError(500, f"internal error: {kind}: {reply.get('error') if isinstance(reply, dict) else reply}")
        return reply

    @router.get("/cache/tree", response_model=CacheTree, response_model_exclude_unset=True,
                responses=ERROR_RESPONSES)
    async def cache_tree(max_depth: int = Query(8, ge=1, le=MAX_DEPTH, description="deepest level returned"),
                         max_nodes: int = Query(200, ge=1, le=MAX_NODES, description="most nodes returned "
                                                "(the biggest subtrees first; the root not counted)")):
        """The top of the prefix tree by size: per node its tokens, hit count, last access, lock
        count and namespace hash; a decoded text preview only with ``--cache-inspector-text``."""
        require_admin()
        tree = await ask("cache_tree", max_depth=max_depth, max_nodes=max_nodes, with_tokens=with_text)
        add_previews(tree["root"], tm.tokenizer.decode, with_text)
        tree["text_preview"] = with_text
        return tree

    @router.get("/cache/stats", response_model=CacheStatsReply, responses=ERROR_RESPONSES)
    async def cache_stats():
        """Hit rate (cached prompt tokens / prompt tokens) over the last minute, 5 minutes and
        since start; evictions; tree and KV pool sizes; running and waiting requests."""
        require_admin()
        stats = await ask("cache_stats")
        stats["requests"]["in_flight"] = len(tm.states)
        return stats

    @router.get("/dashboard", response_class=Response,
                responses={200: {"content": {"text/html": {}}, "description": "the inspector page"}})
    async def dashboard():
        """The inspector page (static HTML + JS; it polls /cache/stats and /cache/tree)."""
        return Response(pages["dashboard.html"], media_type="text/html; charset=utf-8", headers=_HEADERS)

    def asset_route(name: str) -> None:
        async def serve_asset():
            return Response(pages[name], media_type=ASSETS[name], headers=_HEADERS)

        router.add_api_route(f"/dashboard/{name}", serve_asset, methods=["GET"], include_in_schema=False)

    for name in ASSETS:
        asset_route(name)
    return router
