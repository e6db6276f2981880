"""The router's pieces without servers: the approximate prefix tree (checked against a
brute-force model), the policies, routing keys and URL handling."""
from __future__ import annotations

import json
import random

import pytest

from radixserve.config import RouterConfig
from radixserve.router.policy import CacheAware, LeastLoad, RoundRobin
from radixserve.router.prefix_tree import PrefixTree
from radixserve.router.replicas import Replica, ReplicaSet, normalize_url
from radixserve.router.route_key import ids_key, parse_request


def _common(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _check_tree(tree: PrefixTree) -> None:
    """Prefix-closed membership, chars accounting, children keyed by their edge's first char."""
    counts: dict[str, int] = {}
    stack = [tree.root]
    while stack:
        node = stack.pop()
        for key, child in node.children.items():
            assert child.edge and child.edge[0] == key and child.parent is node
            assert set(child.tenants) <= set(node.tenants) or node is tree.root
            for t in child.tenants:
                counts[t] = counts.get(t, 0) + len(child.edge)
            stack.append(child)
    assert {t: n for t, n in counts.items() if n} == {t: n for t, n in tree.chars.items() if n}


def test_tree_matches_brute_force():
    rng = random.Random(0)
    tree = PrefixTree()
    sent: dict[str, list[str]] = {"a": [], "b": [], "c": []}
    for _ in range(400):
        base = rng.choice(["system prompt one. ", "system prompt two! ", "other ", ""])
        text = base + "".join(rng.choice("xyz") for _ in range(rng.randint(0, 12)))
        tenant = rng.choice(list(sent))
        tree.insert(text, tenant)
        sent[tenant].append(text)
        probe = base + "".join(rng.choice("xyz") for _ in range(rng.randint(0, 12)))
        matched, tenants = tree.match(probe)
        best = {t: max((_common(probe, s) for s in texts), default=0) for t, texts in sent.items()}
        assert matched == max(best.values())
        if matched:
            assert sorted(tenants) == sorted(t for t, n in best.items() if n == matched)
        _check_tree(tree)


def test_tree_evicts_lru_leaves_per_tenant():
    now = [0.0]
    tree = PrefixTree(clock=lambda: now[0])
    for i, text in enumerate(["aaaa1111", "aaaa2222", "bbbb3333"]):
        now[0] = float(i)
        tree.insert(text, "r1")
    tree.insert("aaaa2222", "r2")
    assert tree.chars["r1"] == 4 + 4 + 4 + 8
    assert tree.evict(max_chars=13) == 8  # r1's two oldest leaves, "1111" then "2222"
    assert tree.chars == {"r1": 12, "r2": 8}
    assert tree.match("aaaa1111") == (4, ["r1", "r2"])
    assert tree.match("bbbb3333") == (8, ["r1"])
    assert tree.match("aaaa2222") == (8, ["r2"])
    _check_tree(tree)
    tree.remove_tenant("r1")
    assert tree.match("bbbb3333") == (0, [])
    assert tree.match("aaaa2222") == (8, ["r2"])
    _check_tree(tree)


def _replicas(*loads: int) -> list[Replica]:
    return [Replica(f"http://r{i}", inflight=n) for i, n in enumerate(loads)]


def test_cache_aware_sticks_to_the_prefix_holder_until_unbalanced():
    pol = CacheAware(RouterConfig(cache_threshold=0.5, balance_abs_threshold=4, balance_rel_threshold=1.5))
    reps = _replicas(0, 0)
    system = "You are a helpful assistant. " * 10
    first, reason = pol.choose(system + "q1", reps)
    assert reason == "load"
    first.inflight += 1
    again, reason = pol.choose(system + "q2", reps)
    assert (again, reason) == (first, "cache")
    other, reason = pol.choose("completely different text " * 10, reps)
    assert other is not first and reason == "load"  # least loaded
    first.inflight += 10  # now unbalanced: the holder is skipped
    chosen, reason = pol.choose(system + "q3", reps)
    assert chosen is not first and reason == "balance"
    short, reason = pol.choose("You are", _replicas(0, 0))  # a short match below the threshold
    assert reason in ("cache", "load")


def test_round_robin_and_least_load():
    reps = _replicas(3, 1, 2)
    rr = RoundRobin()
    assert [rr.choose("x", reps)[0].url for _ in range(4)] == ["http://r0", "http://r1", "http://r2", "http://r0"]
    assert LeastLoad().choose("x", reps)[0].url == "http://r1"


def test_routing_keys():
    assert parse_request("/generate", b'{"text": "hello", "stream": true}') == ("hello", True)
    assert parse_request("/generate", b'{"text": ["a", "b"]}') == ("a", False)
    assert parse_request("/generate", b'{"input_ids": [[5, 6], [7]]}') == (ids_key([5, 6]), False)
    assert parse_request("/v1/completions", b'{"prompt": [1, 2, 3]}')[0] == ids_key([1, 2, 3])
    chat = {"messages": [{"role": "system", "content": "S"}, {"role": "user",
                                                               "content": [{"type": "text", "text": "U"}]}]}
    assert parse_request("/v1/chat/completions", json.dumps(chat).encode()) == ("<system>S<user>U", False)
    for bad in (b"", b"not json", b"[1,2]", b'{"text": 5}', b"[" * 100000, b'{"messages": "x"}', b"\xff\xfe"):
        assert parse_request("/v1/chat/completions", bad) == ("", False)
        assert parse_request("/generate", bad) == ("", False)
    assert ids_key([1, -1, 2]) == ids_key([1])  # stops at the first id that is not a code point


def test_replica_set_health_and_urls():
    assert normalize_url("127.0.0.1:8000/") == "http://127.0.0.1:8000"
    for bad in ("ftp://x", "http://", "http://h:notaport"):
        with pytest.raises(ValueError, match="url"):
            normalize_url(bad)
    forgotten: list[str] = []
    rs = ReplicaSet(["127.0.0.1:1", "http://127.0.0.1:2"], failure_threshold=2)
    rs.on_unhealthy = rs.on_removed = forgotten.append
    r1 = rs.replicas["http://127.0.0.1:1"]
    rs.health_result(r1, False)
    assert r1.healthy  # one failure is not enough
    rs.health_result(r1, False)
    assert not r1.healthy and forgotten == [r1.url]
    assert [r.url for r in rs.healthy()] == ["http://127.0.0.1:2"]
    rs.health_result(r1, True)
    assert r1.healthy
    rs.mark_failed(r1)
    assert not r1.healthy and forgotten == [r1.url, r1.url]
    assert rs.remove("127.0.0.1:2") and not rs.remove("127.0.0.1:2")
    rs.add("127.0.0.1:1")
    assert r1.healthy


def test_resolve_workers_for_dns_discovery():
    from radixserve.router.replicas import resolve_workers

    assert resolve_workers("localhost:30000")[0] in ("http://127.0.0.1:30000", "http://[::1]:30000")
    assert resolve_workers("127.0.0.1:1234") == ["http://127.0.0.1:1234"]
    for bad in ("nohostport", ":80", "h:port"):
        with pytest.raises(ValueError, match="worker-dns"):
            resolve_workers(bad)


def test_router_discovers_and_drops_replicas_by_dns(monkeypatch):
    import asyncio

    from radixserve.router import app as router_app

    answers = [["http://127.0.0.2:30000", "http://127.0.0.3:30000"], ["http://127.0.0.3:30000"]]
    monkeypatch.setattr(router_app, "resolve_workers", lambda name: answers.pop(0))
    router = router_app.Router(RouterConfig(worker_dns="replicas:30000"), [])
    asyncio.run(router.discover())
    assert sorted(router.replicas.replicas) == ["http://127.0.0.2:30000", "http://127.0.0.3:30000"]
    asyncio.run(router.discover())
    assert list(router.replicas.replicas) == ["http://127.0.0.3:30000"]


def test_the_proxy_drops_idle_connections_before_the_replica_closes_them():
    """At equal keep-alive timeouts (httpx's and uvicorn's default are both 5 s) a request sent on
    a pooled connection can meet the replica's close and fail with a ReadError the replica never
    read. The proxy must open a new connection for a request after an idle gap at which the
    replica still keeps the old one open, but is close to closing it."""
    import asyncio
    import threading
    import time

    import uvicorn

    from radixserve.router.metrics import RouterMetrics
    from radixserve.router.proxy import KEEPALIVE_EXPIRY_S, Proxy
    from radixserve.server.http_utils import SERVER_KEEP_ALIVE_S
    from tests.helpers.server_harness import free_port

    assert KEEPALIVE_EXPIRY_S <= SERVER_KEEP_ALIVE_S / 2
    peers: set = set()

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        peers.add(tuple(scope["client"]))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"ok"})

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           timeout_keep_alive=SERVER_KEEP_ALIVE_S))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 10
    while not server.started and time.time() < deadline:
        time.sleep(0.02)

    async def two_requests() -> None:
        proxy = Proxy(ReplicaSet([f"127.0.0.1:{port}"]), RoundRobin(), RouterMetrics(), 0, 5.0)
        try:
            for _ in range(2):
                resp = await proxy.client.get(f"http://127.0.0.1:{port}/")
                assert resp.status_code == 200
                # past the proxy's expiry, still inside the replica's keep-alive
                await asyncio.sleep((KEEPALIVE_EXPIRY_S + SERVER_KEEP_ALIVE_S) / 2)
        finally:
            await proxy.close()

    try:
        asyncio.run(two_requests())
    finally:
        server.should_exit = True
        thread.join(10)
    assert len(peers) == 2, peers  # the second request did not reuse the idle connection
