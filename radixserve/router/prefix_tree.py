"""The router's approximate prefix tree: which replica was sent which text.

One character-level radix tree shared by all replicas ("tenants").  Inserting text for a
tenant marks every node on its path with the tenant and a time stamp; a match walks the
text as far as the tree goes and reports how many characters matched and which tenants hold
the deepest node reached.  Tenant membership is prefix-closed (a tenant on a node is on all
of its ancestors), so every tenant at the deepest node matches the whole matched length.

It is approximate by design: the replicas evict on their own, and the router never hears
of it.  ``evict`` keeps each tenant under ``max_chars`` by dropping the tenant from its
least recently used leaves, so the tree tracks roughly what a replica can still hold.

Not thread-safe: the router calls it from its event loop only.
"""
from __future__ import annotations

import heapq
import time
from typing import Callable, Optional


class _Node:
    __slots__ = ("edge", "children", "parent", "tenants")

    def __init__(self, edge: str, parent: Optional["_Node"]) -> None:
        self.edge = edge
        self.children: dict[str, _Node] = {}
        self.parent = parent
        self.tenants: dict[str, float] = {}  # tenant -> last access


class PrefixTree:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.root = _Node("", None)
        self.clock = clock
        self.chars: dict[str, int] = {}  # characters held per tenant

    def insert(self, text: str, tenant: str) -> None:
        """Record that ``text`` was sent to ``tenant`` (stamps the whole path)."""
        now = self.clock()
        node, i = self.root, 0
        node.tenants[tenant] = now
        while i < len(text):
            child = node.children.get(text[i])
            if child is None:
                leaf = _Node(text[i:], node)
                node.children[text[i]] = leaf
                self._stamp(leaf, tenant, now)
                return
            common = _common_len(child.edge, text, i)
            if common < len(child.edge):
                child = self._split(child, common)
            node, i = child, i + common
            self._stamp(node, tenant, now)

    def match(self, text: str) -> tuple[int, list[str]]:
        """(characters matched, tenants holding that whole match); refreshes nothing."""
        node, i, tenants = self.root, 0, list(self.root.tenants)
        while i < len(text):
            child = node.children.get(text[i])
            if child is None:
                break
            common = _common_len(child.edge, text, i)
            i += common
            tenants = list(child.tenants)
            if common < len(child.edge):
                break
            node = child
        return (i, tenants) if i else (0, [])

    def remove_tenant(self, tenant: str) -> None:
        """Forget everything sent to ``tenant`` (a replica removed from the router)."""
        stack = [self.root]
        while stack:
            node = stack.pop()
            node.tenants.pop(tenant, None)
            stack.extend(node.children.values())
        self.chars.pop(tenant, None)
        self._prune(self.root)

    def evict(self, max_chars: int) -> int:
        """Drop each tenant's least recently used leaves until it holds at most ``max_chars``;
        returns the characters dropped."""
        dropped = 0
        for tenant in [t for t, n in self.chars.items() if n > max_chars]:
            heap = [(ts, id(n), n) for n in self._leaves_of(tenant) for ts in [n.tenants[tenant]]]
            heapq.heapify(heap)
            while heap and self.chars[tenant] > max_chars:
                _, _, node = heapq.heappop(heap)
                node.tenants.pop(tenant, None)
                self.chars[tenant] -= len(node.edge)
                dropped += len(node.edge)
                parent = node.parent
                if parent is not None and parent is not self.root and tenant in parent.tenants and \
                        not any(tenant in c.tenants for c in parent.children.values()):
                    heapq.heappush(heap, (parent.tenants[tenant], id(parent), parent))
        self._prune(self.root)
        return dropped

    # ------------------------------------------------------------------ internals
    def _stamp(self, node: _Node, tenant: str, now: float) -> None:
        if tenant not in node.tenants:
            self.chars[tenant] = self.chars.get(tenant, 0) + len(node.edge)
        node.tenants[tenant] = now

    def _split(self, child: _Node, at: int) -> _Node:
        """Cut ``child``'s edge at ``at``: a new middle node takes the first part."""
        parent = child.parent
        assert parent is not None
        mid = _Node(child.edge[:at], parent)
        mid.tenants = dict(child.tenants)
        parent.children[mid.edge[0]] = mid
        child.edge = child.edge[at:]
        child.parent = mid
        mid.children[child.edge[0]] = child
        return mid

    def _leaves_of(self, tenant: str) -> list[_Node]:
        """Nodes of ``tenant`` none of whose children belong to it."""
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            if tenant not in node.tenants:
                continue
            kids = [c for c in node.children.values() if tenant in c.tenants]
            if kids:
                stack.extend(kids)
            else:
                out.append(node)
        return out

    def _prune(self, root: _Node) -> None:
        """Remove subtrees no tenant holds (membership is prefix-closed, so a node without
        tenants has none below it)."""
        stack = [root]
        while stack:
            node = stack.pop()
            for key, child in list(node.children.items()):
                if child.tenants:
                    stack.append(child)
                else:
                    del node.children[key]

def _common_len(edge: str, text: str, start: int) -> int:
    n = min(len(edge), len(text) - start)
    i = 0
    while i < n and edge[i] == text[start + i]:
        i += 1
    return i
