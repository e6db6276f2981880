"""The router's view of its replicas: URL, health, requests in flight.

Mutated only from the router's event loop (no locks).  ``inflight`` is the router's own
count of requests it has forwarded and not yet finished (streams count until their last
byte), which is the load the policies balance.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional
from urllib.parse import urlsplit


@dataclass
class Replica:
    url: str
    healthy: bool = True
    inflight: int = 0
    failures: int = 0  # consecutive failed health checks
    requests: int = 0  # forwarded (all outcomes)
    errors: int = 0  # connect failures and mid-request failures
    labels: dict[str, str] = field(default_factory=dict)


def normalize_url(url: str) -> str:
    """``host:port`` or ``http://host:port/`` -> ``http://host:port``; ValueError names the problem."""
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"url: not an http(s) URL: {url!r}")
    try:
        parts.port
    except ValueError:
        raise ValueError(f"url: bad port in {url!r}") from None
    return f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"


def resolve_workers(name_port: str) -> list[str]:
    """``"host:port"`` -> one URL per address the host resolves to (blocking DNS)."""
    import socket

    host, sep, port = name_port.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"worker-dns: expected host:port, got {name_port!r}")
    infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    addrs = sorted({info[4][0] for info in infos})
    return [f"http://[{a}]:{port}" if ":" in a else f"http://{a}:{port}" for a in addrs]


class ReplicaSet:
    """Ordered replicas; ``on_unhealthy``/``on_removed`` let the policy forget a replica's
    cache (a replica that comes back after failing has most likely restarted cold)."""

    def __init__(self, urls: list[str], failure_threshold: int = 2) -> None:
        self.replicas: dict[str, Replica] = {}
        self.failure_threshold = failure_threshold
        self.on_unhealthy: Optional[Callable[[str], None]] = None
        self.on_removed: Optional[Callable[[str], None]] = None
        for u in urls:
            self.add(u)

    def add(self, url: str) -> Replica:
        """Add (or re-enable) a replica; it takes traffic at once and is checked like the others."""
        url = normalize_url(url)
        r = self.replicas.get(url)
        if r is None:
            r = self.replicas[url] = Replica(url)
        r.healthy, r.failures = True, 0
        return r

    def remove(self, url: str) -> bool:
        r = self.replicas.pop(normalize_url(url), None)
        if r is not None and self.on_removed:
            self.on_removed(r.url)
        return r is not None

    def healthy(self, exclude: frozenset[str] = frozenset()) -> list[Replica]:
        return [r for r in self.replicas.values() if r.healthy and r.url not in exclude]

    def mark_failed(self, r: Replica) -> None:
        """A connect failure: out of rotation until a health check succeeds."""
        r.errors += 1
        r.failures = max(r.failures, self.failure_threshold)
        self._set_unhealthy(r)

    def health_result(self, r: Replica, ok: bool) -> None:
        if ok:
            r.failures, r.healthy = 0, True
            return
        r.failures += 1
        if r.failures >= self.failure_threshold:
            self._set_unhealthy(r)

    def _set_unhealthy(self, r: Replica) -> None:
        if r.healthy:
            r.healthy = False
            if self.on_unhealthy:
                self.on_unhealthy(r.url)
