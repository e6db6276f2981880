"""A bounded, read-only snapshot of the prefix tree for the inspector (``GET /cache/tree``).

``tree_snapshot`` runs in the scheduler thread between steps, so its cost is bounded: one
breadth-first pass over at most ``scan_budget`` nodes computes subtree sizes (a larger tree
gets sizes that count only the scanned nodes: ``scan_complete`` is then False), and the
reply holds at most ``max_nodes`` nodes no deeper than ``max_depth``: the biggest subtrees
first, so what is returned is the top of the tree by size.  Nothing in the tree changes (no
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
from typing import Any, Optional

from radixserve.mem_cache.prefix_cache import PrefixCache
from radixserve.mem_cache.tree_node import TreeNode

SCAN_BUDGET = 50_000  # nodes visited for subtree sizes (a few tens of ms of Python)
PREVIEW_TOKENS = 64  # token ids per node sent for the text preview


def namespace_id(salt: Optional[str]) -> Optional[str]:
    """A short, stable hash naming a cache namespace without revealing it (None: shared)."""
    return None if salt is None else hashlib.sha256(salt.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def _subtree_sizes(root: TreeNode, budget: int) -> tuple[dict[int, tuple[int, int]], bool]:
    """{id(node): (subtree tokens, subtree nodes)} for up to ``budget`` nodes taken breadth
    first (the root not counted); True when that was the whole tree."""
    order, i = [root], 0
    while i < len(order) and len(order) <= budget:
        order.extend(order[i].children.values())
        i += 1
    complete = i == len(order)
    order = order[: budget + 1]
    sizes: dict[int, tuple[int, int]] = {}
    for node in reversed(order):
        tokens, nodes = len(node.key), (1 if node is not root else 0)
        for c in node.children.values():
            t, n = sizes.get(id(c), (len(c.key), 1))
            tokens, nodes = tokens + t, nodes + n
        sizes[id(node)] = (tokens, nodes)
    return sizes, complete


def tree_snapshot(cache: PrefixCache, max_depth: int = 8, max_nodes: int = 200, with_tokens: bool = False,
                  scan_budget: int = SCAN_BUDGET) -> dict[str, Any]:
    """The top of ``cache``'s tree as JSON-ready dicts (see docs/INSPECTOR.md for the fields).

    ``max_depth`` >= 1 and ``max_nodes`` >= 1 bound the reply (the root is always included and
    not counted); ``with_tokens`` adds ``token_ids`` (the first ``PREVIEW_TOKENS`` of each
    unsalted node's edge).  Read-only; scheduler thread only, like the cache.
    """
    max_depth, max_nodes = max(1, int(max_depth)), max(1, int(max_nodes))
    now = time.monotonic()
    sizes, complete = _subtree_sizes(cache.root, max(1, int(scan_budget)))
    seq = itertools.count(1)

    def size(node: TreeNode) -> tuple[int, int]:
        return sizes.get(id(node), (len(node.key), 1))

    total_tokens, total_nodes = size(cache.root)
    root_out: dict[str, Any] = {
        "id": 0, "depth": 0, "tokens": 0, "prefix_tokens": 0, "subtree_tokens": total_tokens,
        "subtree_nodes": total_nodes, "hit_count": cache.counters.totals["requests"], "last_access_s": None,
        "lock_count": None, "namespace": None, "children": []}
    shown: list[tuple[TreeNode, dict[str, Any]]] = [(cache.root, root_out)]
    heap: list[tuple[int, int, TreeNode, dict[str, Any]]] = []

    def push_children(node: TreeNode, out: dict[str, Any]) -> None:
        if out["depth"] < max_depth:
            for c in node.children.values():
                heapq.heappush(heap, (-size(c)[0], next(seq), c, out))

    push_children(cache.root, root_out)
    while heap and len(shown) <= max_nodes:
        _, nid, node, parent_out = heapq.heappop(heap)
        out = _node_out(node, nid, parent_out, size(node), now, with_tokens)
        parent_out["children"].append(out)
        shown.append((node, out))
        push_children(node, out)
    for node, out in shown:
        kept = sum(c["subtree_tokens"] for c in out["children"])
        out["omitted_children"] = len(node.children) - len(out["children"])
        out["omitted_tokens"] = max(0, out["subtree_tokens"] - out["tokens"] - kept)
    return {"cache": cache.kind, "tree_tokens": cache.total_size(), "tree_nodes": cache.num_nodes,
            "scanned_nodes": len(sizes) - 1, "scan_complete": complete, "returned_nodes": len(shown) - 1,
            "max_depth": max_depth, "max_nodes": max_nodes, "root": root_out}


def _node_out(node: TreeNode, nid: int, parent_out: dict[str, Any], size: tuple[int, int], now: float,
              with_tokens: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": nid, "depth": parent_out["depth"] + 1, "tokens": len(node.key),
        "prefix_tokens": parent_out["prefix_tokens"] + parent_out["tokens"],
        "subtree_tokens": size[0], "subtree_nodes": size[1], "hit_count": node.hit_count,
        "last_access_s": round(max(0.0, now - node.access_time), 3), "lock_count": node.lock_ref,
        "namespace": namespace_id(node.salt), "children": []}
    if with_tokens and node.salt is None:
        out["token_ids"] = list(node.key[:PREVIEW_TOKENS])
        out["token_ids_truncated"] = len(node.key) > PREVIEW_TOKENS
    return out
