"""The router's Prometheus metrics (its own registry), per replica."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from radixserve.router.replicas import ReplicaSet

P = "radixserve_router_"


class RouterMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(P + "requests", "Forwarded requests by replica and outcome (HTTP status, "
                                "connect_error, failed)", ["replica", "outcome"], registry=r)
        self.decisions = Counter(P + "routing_decisions", "Routing decisions by replica and reason "
                                 "(cache, load, balance, round_robin)", ["replica", "reason"], registry=r)
        self.retries = Counter(P + "retries", "Requests retried on another replica", registry=r)
        self.inflight = Gauge(P + "inflight_requests", "Requests in flight per replica", ["replica"], registry=r)
        self.healthy = Gauge(P + "replica_healthy", "1 if the replica takes traffic", ["replica"], registry=r)
        self.tree_chars = Gauge(P + "tree_chars", "Characters of the approximate prefix tree per replica",
                                ["replica"], registry=r)

    def decision(self, url: str, reason: str) -> None:
        self.decisions.labels(url, reason).inc()

    def outcome(self, url: str, outcome: str) -> None:
        self.requests.labels(url, outcome).inc()

    def render(self, replicas: ReplicaSet, tree_chars: dict[str, int]) -> bytes:
        for r in replicas.replicas.values():
            self.inflight.labels(r.url).set(r.inflight)
            self.healthy.labels(r.url).set(1 if r.healthy else 0)
            self.tree_chars.labels(r.url).set(tree_chars.get(r.url, 0))
        return generate_latest(self.registry)
