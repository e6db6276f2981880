"""Routing policies: which healthy replica gets a request.

Contract: ``choose(text, replicas)`` gets the routing text of the request (``route_key.py``)
and a non-empty list of healthy replicas; it returns one of them and the reason
("cache", "balance", "load", "round_robin"), and may record the choice (the cache-aware
policy inserts the text into its tree).  ``forget(url)`` drops what the policy knows of a
replica.  Called from the router's event loop only.
"""
from __future__ import annotations

import itertools
from typing import Protocol

from radixserve.config import RouterConfig
from radixserve.router.prefix_tree import PrefixTree
from radixserve.router.replicas import Replica


class Policy(Protocol):
    name: str

    def choose(self, text: str, replicas: list[Replica]) -> tuple[Replica, str]: ...

    def forget(self, url: str) -> None: ...


class RoundRobin:
    name = "round_robin"

    def __init__(self) -> None:
        self._n = itertools.count()

    def choose(self, text: str, replicas: list[Replica]) -> tuple[Replica, str]:
        return replicas[next(self._n) % len(replicas)], "round_robin"

    def forget(self, url: str) -> None:
        pass


class LeastLoad:
    name = "least_load"

    def choose(self, text: str, replicas: list[Replica]) -> tuple[Replica, str]:
        return min(replicas, key=lambda r: r.inflight), "load"

    def forget(self, url: str) -> None:
        pass


class CacheAware:
    """SGLang's router policy on an approximate per-replica prefix tree (see RouterConfig)."""

    name = "cache_aware"

    def __init__(self, cfg: RouterConfig) -> None:
        self.cfg = cfg
        self.tree = PrefixTree()

    def balanced(self, replicas: list[Replica]) -> bool:
        loads = [r.inflight for r in replicas]
        hi, lo = max(loads), min(loads)
        return hi - lo <= self.cfg.balance_abs_threshold or hi <= self.cfg.balance_rel_threshold * lo

    def choose(self, text: str, replicas: list[Replica]) -> tuple[Replica, str]:
        if not self.balanced(replicas):
            chosen, reason = min(replicas, key=lambda r: r.inflight), "balance"
        else:
            matched, tenants = self.tree.match(text)
            holders = [r for r in replicas if r.url in tenants]
            if holders and text and matched / len(text) >= self.cfg.cache_threshold:
                chosen, reason = min(holders, key=lambda r: r.inflight), "cache"
            else:  # least loaded; on a tie the one whose tree holds least (most room for a new prefix)
                chosen = min(replicas, key=lambda r: (r.inflight, self.tree.chars.get(r.url, 0)))
                reason = "load"
        if text:
            self.tree.insert(text, chosen.url)
        return chosen, reason

    def evict(self) -> int:
        return self.tree.evict(self.cfg.max_tree_chars)

    def forget(self, url: str) -> None:
        self.tree.remove_tenant(url)


def make_policy(cfg: RouterConfig) -> Policy:
    if cfg.policy == "round_robin":
        return RoundRobin()
    if cfg.policy == "least_load":
        return LeastLoad()
    return CacheAware(cfg)
