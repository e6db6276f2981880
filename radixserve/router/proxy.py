"""Forward one request to a replica chosen by the policy, with retries and clean failures.

Retried on another replica (up to ``max_retries``): a connect failure (the request never
reached the replica) and a 503 answer (refused before any work: queue full or unhealthy).
Never retried: a failure after the request was sent (it may have run); the client gets a
502 naming the replica, or, mid-stream, an SSE error event and ``[DONE]``.  A stream's
replica counts the request in flight until the stream ends or the client disconnects (which
closes the upstream connection, so the replica aborts the request).
"""
from __future__ import annotations

import logging
from typing import AsyncIterator, Optional

import anyio
import httpx
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask

from radixserve.router.metrics import RouterMetrics
from radixserve.router.policy import Policy
from radixserve.router.replicas import Replica, ReplicaSet
from radixserve.server.http_utils import SERVER_KEEP_ALIVE_S, SSE_DONE, error_body, error_response, sse

logger = logging.getLogger("radixserve.router")

# hop-by-hop and length headers are recomputed on each side
_DROP = {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "te", "upgrade",
         "proxy-authorization", "proxy-connection", "accept-encoding"}
_PASS_BACK = ("content-type", "retry-after", "cache-control")
# idle pooled connections are dropped well before a replica closes them (see SERVER_KEEP_ALIVE_S)
KEEPALIVE_EXPIRY_S = SERVER_KEEP_ALIVE_S / 2.5


def forward_headers(headers: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in _DROP}


def _back_headers(resp: httpx.Response) -> dict[str, str]:
    return {k: resp.headers[k] for k in _PASS_BACK if k in resp.headers}


class Proxy:
    def __init__(self, replicas: ReplicaSet, policy: Policy, metrics: RouterMetrics, max_retries: int,
                 timeout: float) -> None:
        self.replicas = replicas
        self.policy = policy
        self.metrics = metrics
        self.max_retries = max_retries
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=5.0),
                                        limits=httpx.Limits(max_connections=None, max_keepalive_connections=64,
                                                            keepalive_expiry=KEEPALIVE_EXPIRY_S))

    async def close(self) -> None:
        await self.client.aclose()

    async def forward(self, method: str, path: str, query: str, body: bytes, headers: dict[str, str],
                      text: str, stream: bool) -> Response:
        tried: set[str] = set()
        last: Optional[Response] = None
        for attempt in range(self.max_retries + 1):
            candidates = self.replicas.healthy(frozenset(tried))
            if not candidates:
                break
            replica, reason = self.policy.choose(text, candidates)
            tried.add(replica.url)
            self.metrics.decision(replica.url, reason)
            if attempt:
                self.metrics.retries.inc()
            url = replica.url + path + (f"?{query}" if query else "")
            req = self.client.build_request(method, url, content=body, headers=forward_headers(headers))
            replica.inflight += 1  # until the answer (or the stream) is read to its end
            replica.requests += 1
            try:
                resp = await self.client.send(req, stream=True)
            except (httpx.ConnectError, httpx.ConnectTimeout) as e:
                replica.inflight -= 1
                logger.warning("replica %s unreachable (%s); retrying elsewhere", replica.url, e)
                self.replicas.mark_failed(replica)
                self.metrics.outcome(replica.url, "connect_error")
                continue
            except httpx.HTTPError as e:
                replica.inflight -= 1
                replica.errors += 1
                self.metrics.outcome(replica.url, "failed")
                return error_response(502, f"replica {replica.url} failed: {type(e).__name__}: {e}")
            except BaseException:  # cancelled: the client went away while we waited
                replica.inflight -= 1
                raise
            if stream and resp.status_code == 200:
                relay = _Relay(resp, replica, self.metrics)
                # the background task runs even when a disconnect cancels the body before it starts
                return StreamingResponse(relay.body(), status_code=200, headers=_back_headers(resp),
                                         background=BackgroundTask(relay.finish, "200"))
            last = await self._buffer(resp, replica)
            if last.status_code != 503:
                return last
        if last is not None:
            return last
        return error_response(503, "no healthy replica could take the request; retry later",
                              headers={"Retry-After": "1"})

    async def _buffer(self, resp: httpx.Response, replica: Replica) -> Response:
        try:
            content = await resp.aread()
        except httpx.HTTPError as e:
            replica.errors += 1
            self.metrics.outcome(replica.url, "failed")
            return error_response(502, f"replica {replica.url} failed mid-response: {type(e).__name__}: {e}")
        finally:
            replica.inflight -= 1
            await resp.aclose()
        self.metrics.outcome(replica.url, str(resp.status_code))
        return Response(content, status_code=resp.status_code, headers=_back_headers(resp))



class _Relay:
    """One upstream stream relayed to the client; ``finish`` runs once, however it ends."""

    def __init__(self, resp: httpx.Response, replica: Replica, metrics: RouterMetrics) -> None:
        self.resp, self.replica, self.metrics = resp, replica, metrics
        self.done = False

    async def body(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self.resp.aiter_raw():
                yield chunk
        except httpx.HTTPError as e:
            self.replica.errors += 1
            msg = f"replica {self.replica.url} failed mid-stream: {type(e).__name__}: {e}"
            logger.warning(msg)
            await self.finish("failed")
            yield (sse(error_body(502, msg)) + SSE_DONE).encode()
        finally:
            await self.finish("200")

    async def finish(self, outcome: str) -> None:
        if self.done:
            return
        self.done = True
        self.replica.inflight -= 1
        self.metrics.outcome(self.replica.url, outcome)
        with anyio.CancelScope(shield=True):  # a client disconnect cancels us: still close upstream
            await self.resp.aclose()
