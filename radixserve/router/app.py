"""The router's HTTP app: the replicas' routes, proxied; admin routes for the replica set.

Request routes (/generate, /v1/completions, /v1/chat/completions, /v1/embeddings, and any
other POST) go to one replica chosen by the policy (``proxy.py``); information routes go to
the first healthy replica; /flush_cache and /abort_request go to all.  /health is 200 while
one replica is healthy.  A background task checks the replicas' /health and trims the
prefix tree.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Callable, Optional

import httpx
from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response

from radixserve.config import RouterConfig
from radixserve.router.metrics import RouterMetrics
from radixserve.router.policy import CacheAware, make_policy
from radixserve.router.proxy import Proxy, forward_headers
from radixserve.router.replicas import ReplicaSet, resolve_workers
from radixserve.router.route_key import parse_request
from radixserve.server.http_utils import error_response

logger = logging.getLogger("radixserve.router")

INFO_ROUTES = ("/v1/models", "/get_model_info", "/get_server_info", "/server_info", "/health_generate")
FANOUT_ROUTES = ("/flush_cache", "/abort_request", "/load_lora_adapter", "/unload_lora_adapter")
ADMIN_FANOUT = ("/flush_cache", "/load_lora_adapter", "/unload_lora_adapter")  # need the router's API key


class Router:
    """State shared by the routes; ``checks`` runs health checks and tree eviction."""

    def __init__(self, cfg: RouterConfig, urls: list[str]) -> None:
        self.cfg = cfg
        self.replicas = ReplicaSet(urls, cfg.health_failure_threshold)
        self.policy = make_policy(cfg)
        self.replicas.on_unhealthy = self.replicas.on_removed = self.policy.forget
        self.metrics = RouterMetrics()
        self.proxy = Proxy(self.replicas, self.policy, self.metrics, cfg.max_retries, cfg.request_timeout)
        self.discovered: set[str] = set()

    def tree_chars(self) -> dict[str, int]:
        return dict(self.policy.tree.chars) if isinstance(self.policy, CacheAware) else {}

    async def discover(self) -> None:
        """Sync the replicas found through ``worker_dns`` with what the name resolves to now."""
        if not self.cfg.worker_dns:
            return
        try:
            found = set(await asyncio.to_thread(resolve_workers, self.cfg.worker_dns))
        except (OSError, ValueError) as e:
            logger.warning("worker-dns %s: %s", self.cfg.worker_dns, e)
            return
        for url in found - self.discovered:
            logger.info("replica %s discovered", url)
            self.replicas.add(url)
        for url in self.discovered - found:
            logger.info("replica %s no longer resolves; removed", url)
            self.replicas.remove(url)
        self.discovered = found

    async def check_once(self, client: httpx.AsyncClient) -> None:
        await self.discover()
        async def one(r: Any) -> None:
            try:
                ok = (await client.get(r.url + "/health", timeout=max(1.0, self.cfg.health_check_interval))).status_code == 200
            except httpx.HTTPError:
                ok = False
            was = r.healthy
            self.replicas.health_result(r, ok)
            if was != r.healthy:
                logger.warning("replica %s is %s", r.url, "healthy again" if r.healthy else "unhealthy")
        await asyncio.gather(*(one(r) for r in list(self.replicas.replicas.values())))

    async def checks(self) -> None:
        last_evict = asyncio.get_running_loop().time()
        async with httpx.AsyncClient() as client:
            while True:
                await self.check_once(client)
                now = asyncio.get_running_loop().time()
                if isinstance(self.policy, CacheAware) and now - last_evict >= self.cfg.eviction_interval:
                    self.policy.evict()
                    last_evict = now
                await asyncio.sleep(self.cfg.health_check_interval)


def _is_admin(router: Router, request: Request) -> bool:
    key = router.cfg.api_key
    return key is None or request.headers.get("authorization") == f"Bearer {key}"


def create_router_app(router: Router) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        async with httpx.AsyncClient() as client:  # serve only after one look at the replicas
            await router.check_once(client)
        task = asyncio.create_task(router.checks())
        try:
            yield
        finally:
            task.cancel()
            await router.proxy.close()

    app = FastAPI(title="radixserve router", lifespan=lifespan)

    @app.get("/health")
    async def health() -> Response:
        if router.replicas.healthy():
            return JSONResponse({"status": "ok", "healthy_replicas": len(router.replicas.healthy())})
        return error_response(503, "no healthy replica")

    @app.get("/list_workers")
    async def list_workers() -> dict:
        chars = router.tree_chars()
        return {"policy": router.policy.name, "workers": [
            {"url": r.url, "healthy": r.healthy, "inflight": r.inflight, "requests": r.requests,
             "errors": r.errors, "tree_chars": chars.get(r.url, 0)} for r in router.replicas.replicas.values()]}

    @app.post("/add_worker")
    async def add_worker(request: Request, url: str = Query(..., max_length=2048)) -> Response:
        return _admin_op(request, "/add_worker", lambda: {"added": router.replicas.add(url).url})

    @app.post("/remove_worker")
    async def remove_worker(request: Request, url: str = Query(..., max_length=2048)) -> Response:
        return _admin_op(request, "/remove_worker",
                         lambda: {"removed": url} if router.replicas.remove(url) else None, url)

    def _admin_op(request: Request, route: str, op: Callable[[], Optional[dict]], url: str = "") -> Response:
        """Run ``op`` for an admin key; a ValueError is a 400, a None result a 404."""
        if not _is_admin(router, request):
            return error_response(401, f"authorization: {route} needs the router's API key")
        try:
            out = op()
        except ValueError as e:
            return error_response(400, str(e))
        return JSONResponse(out) if out is not None else error_response(404, f"url: no replica {url!r}")

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(router.metrics.render(router.replicas, router.tree_chars()),
                        media_type="text/plain; version=0.0.4")

    @app.api_route("/{path:path}", methods=["GET", "POST"])
    async def proxied(path: str, request: Request) -> Response:
        path = "/" + path
        body = await request.body()
        if path in FANOUT_ROUTES:
            if path in ADMIN_FANOUT and not _is_admin(router, request):
                return error_response(401, f"authorization: {path} needs the router's API key")
            return await fan_out(request.method, path, body, dict(request.headers))
        if request.method == "GET" or path in INFO_ROUTES:
            text, stream = "", False
        else:
            text, stream = parse_request(path, body)
        return await router.proxy.forward(request.method, path, request.url.query, body, dict(request.headers),
                                          text, stream)

    async def fan_out(method: str, path: str, body: bytes, headers: dict[str, str]) -> Response:
        out = {}
        for r in router.replicas.healthy():
            try:
                resp = await router.proxy.client.request(method, r.url + path, content=body,
                                                         headers=forward_headers(headers), timeout=30)
                out[r.url] = resp.status_code
            except httpx.HTTPError as e:
                out[r.url] = f"{type(e).__name__}: {e}"
        if path == "/flush_cache":
            for url in list(out):
                router.policy.forget(url)
        # a replica's own 4xx/5xx is the answer's status (a LoRA adapter must load everywhere or
        # the client hears of it); one that could not be reached is a 502
        codes = [c if isinstance(c, int) else 502 for c in out.values()]
        worst = max((c for c in codes if c >= 400), default=200)
        return JSONResponse({"replicas": out}, status_code=worst)

    return app

