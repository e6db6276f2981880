"""A bounded, read-only snapshot of the prefix tree for the inspector (``GET /cache/tree``).

``tree_snapshot`` runs in the scheduler thread between steps, so its cost is bounded: one
breadth-first pass over at most ``scan_budget`` nodes computes subtree sizes, and at most
about as many children are ranked to choose what to show (a larger tree gets sizes that
count only the scanned nodes and an approximate order: ``scan_complete`` is then False).
The reply holds at most ``max_nodes`` nodes no deeper than ``max_depth``: the biggest
subtrees first, so what is returned is the top of the tree by size.  Nothing in the tree changes (no
split, no LRU stamp, no lock).

Privacy: token ids are returned only with ``with_tokens`` (the server decodes them into a
preview with ``--cache-inspector-text``), and never for a salted node: a namespace shows
only as a short hash of its salt.
"""
from __future__ import annotations

import hashlib
import heapq
import itertools
import time
from operator import itemgetter
from typing import Any, Optional

from radixserve.mem_cache.prefix_cache import PrefixCache
from radixserve.mem_cache.tree_node import TreeNode

SCAN_BUDGET = 20_000  # nodes sized, and children ranked, per snapshot (tens of ms of Python)
PREVIEW_TOKENS = 64  # token ids per node sent for the text preview


def namespace_id(salt: Optional[str]) -> Optional[str]:
    """A short, stable hash naming a cache namespace without revealing it (None: shared)."""
    return None if salt is None else hashlib.sha256(salt.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def node_tiers(node: TreeNode) -> list[str]:
    """Where the node's KV is: "pool", "host", "disk" (the last two with the hierarchical cache)."""
    return [name for name, held in (("pool", node.value is not None), ("host", node.host is not None),
                                    ("disk", node.disk is not None)) if held]


def _subtree_sizes(root: TreeNode, budget: int) -> tuple[dict[int, int], dict[int, int], bool]:
    """Subtree tokens and subtree nodes by ``id(node)`` for up to ``budget`` nodes taken
    breadth first (the root's own entry counts every node but itself); True when that was
    the whole tree.  A child beyond the budget counts as its own edge only."""
    order, i = [root], 0
    while i < len(order) and len(order) <= budget:
        order.extend(order[i].children.values())
        i += 1
    complete = i == len(order)
    del order[budget + 1:]
    tokens: dict[int, int] = {}
    nodes: dict[int, int] = {}
    for node in reversed(order):
        t, n = len(node.key), 1
        for c in node.children.values():
            cid = id(c)
            if cid in tokens:
                t, n = t + tokens[cid], n + nodes[cid]
            else:
                t, n = t + len(c.key), n + 1
        tokens[id(node)], nodes[id(node)] = t, n
    nodes[id(root)] -= 1
    return tokens, nodes, complete


def tree_snapshot(cache: PrefixCache, max_depth: int = 8, max_nodes: int = 200, with_tokens: bool = False,
                  scan_budget: int = SCAN_BUDGET) -> dict[str, Any]:
    """The top of ``cache``'s tree as JSON-ready dicts (see docs/INSPECTOR.md for the fields).

    ``max_depth`` >= 1 and ``max_nodes`` >= 1 bound the reply (the root is always included and
    not counted); ``with_tokens`` adds ``token_ids`` (the first ``PREVIEW_TOKENS`` of each
    unsalted node's edge).  Read-only; scheduler thread only, like the cache.
    """
    max_depth, max_nodes = max(1, int(max_depth)), max(1, int(max_nodes))
    now = time.monotonic()
    budget = max(1, int(scan_budget))
    tokens, nodes, complete = _subtree_sizes(cache.root, budget)
    seq = itertools.count(1)
    root_out: dict[str, Any] = {
        "id": 0, "depth": 0, "tokens": 0, "prefix_tokens": 0, "subtree_tokens": tokens[id(cache.root)],
        "subtree_nodes": nodes[id(cache.root)], "hit_count": cache.counters.totals["requests"],
        "last_access_s": None, "lock_count": None, "namespace": None, "tiers": [], "children": []}
    shown: list[tuple[TreeNode, dict[str, Any]]] = [(cache.root, root_out)]
    heap: list[tuple[int, int, TreeNode, dict[str, Any]]] = []
    looked = 0  # children ranked so far: bounded by the scan budget (then 16 per shown node)

    def push_children(node: TreeNode, out: dict[str, Any]) -> None:
        nonlocal complete, looked
        room = max_nodes + 1 - len(shown)  # no more than this many of its children can be shown
        if out["depth"] >= max_depth or room <= 0 or not node.children:
            return
        budget_left = max(budget - looked, min(room, 16))
        children = node.children.values()
        if len(children) > budget_left:  # rank only some of them: the order is then approximate
            children, complete = itertools.islice(children, budget_left), False
        kids = [(tokens.get(id(c), len(c.key)), c) for c in children]
        looked += len(kids)
        if len(kids) > room:
            kids = heapq.nlargest(room, kids, key=itemgetter(0))
        for size, c in kids:
            heapq.heappush(heap, (-size, next(seq), c, out))

    push_children(cache.root, root_out)
    while heap and len(shown) <= max_nodes:
        _, nid, node, parent_out = heapq.heappop(heap)
        size = (tokens.get(id(node), len(node.key)), nodes.get(id(node), 1))
        out = _node_out(node, nid, parent_out, size, now, with_tokens)
        parent_out["children"].append(out)
        shown.append((node, out))
        push_children(node, out)
    for node, out in shown:
        kept = sum(c["subtree_tokens"] for c in out["children"])
        out["omitted_children"] = len(node.children) - len(out["children"])
        out["omitted_tokens"] = max(0, out["subtree_tokens"] - out["tokens"] - kept)
    return {"cache": cache.kind, "tree_tokens": cache.total_size(), "tree_nodes": cache.num_nodes,
            "scanned_nodes": len(tokens) - 1, "scan_complete": complete, "returned_nodes": len(shown) - 1,
            "max_depth": max_depth, "max_nodes": max_nodes, "root": root_out}


def _node_out(node: TreeNode, nid: int, parent_out: dict[str, Any], size: tuple[int, int], now: float,
              with_tokens: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": nid, "depth": parent_out["depth"] + 1, "tokens": len(node.key),
        "prefix_tokens": parent_out["prefix_tokens"] + parent_out["tokens"],
        "subtree_tokens": size[0], "subtree_nodes": size[1], "hit_count": node.hit_count,
        "last_access_s": round(max(0.0, now - node.access_time), 3), "lock_count": node.lock_ref,
        "namespace": namespace_id(node.salt), "tiers": node_tiers(node), "children": []}
    if with_tokens and node.salt is None:
        out["token_ids"] = list(node.key[:PREVIEW_TOKENS])
        out["token_ids_truncated"] = len(node.key) > PREVIEW_TOKENS
    return out
