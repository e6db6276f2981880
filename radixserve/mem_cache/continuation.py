"""What the prefix tree holds right after a token sequence (other requests' text), read-only.

Used by speculative decoding to propose tokens another request already produced after the
same text.  Nothing is locked, split or stamped, so a look-up never changes eviction order.
"""
from __future__ import annotations

from typing import Optional, Sequence

from radixserve.mem_cache.tree_node import TreeNode, child_key


def continuation(node: TreeNode, tokens: Sequence[int], n: int, salt: Optional[str] = None) -> list[int]:
    """Up to ``n`` tokens that follow ``tokens`` in the tree, where ``tokens`` continue the path
    that ends at the end of ``node``'s edge; at a fork the most recently used child is
    followed.  [] when the tree does not hold ``tokens`` after ``node``.  Only nodes of
    namespace ``salt`` are read (the root's children mix namespaces)."""
    key, off, i = node.key, len(node.key), 0
    while i < len(tokens):
        if off == len(key):
            child = node.children.get(child_key(salt, tokens[i]))
            if child is None:
                return []
            node, key, off = child, child.key, 0
        m = min(len(key) - off, len(tokens) - i)
        if key[off: off + m] != list(tokens[i: i + m]):
            return []
        off, i = off + m, i + m
    out: list[int] = []
    while len(out) < n:
        if off == len(key):
            same = [c for c in node.children.values() if c.salt == salt]
            if not same:
                break
            node = max(same, key=lambda c: c.last_access)
            key, off = node.key, 0
        take = key[off: off + n - len(out)]
        out.extend(take)
        off += len(take)
    return out
