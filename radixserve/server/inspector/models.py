"""Response models of the cache inspector's routes (``GET /cache/tree``, ``GET /cache/stats``).

They are the routes' ``response_model``: the OpenAPI document describes exactly what is sent,
and a reply that does not fit is a server bug (500), never a silently different shape.
Fields are documented in docs/INSPECTOR.md.
"""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, Field

from radixserve.server.openapi_doc import ErrorBody


class CacheNode(BaseModel):
    """One node of the prefix tree: an edge of ``tokens`` tokens after ``prefix_tokens``."""

    id: int = Field(ge=0, description="position in this reply (0: the root); not stable across replies")
    depth: int = Field(ge=0)
    tokens: int = Field(ge=0, description="tokens on this node's edge")
    prefix_tokens: int = Field(ge=0, description="tokens on the path above this node")
    subtree_tokens: int = Field(ge=0, description="tokens in this node and everything below it")
    subtree_nodes: int = Field(ge=0)
    hit_count: int = Field(ge=0, description="admissions whose cached prefix ran through this node "
                                             "(root: every admission)")
    last_access_s: Optional[float] = Field(description="seconds since a match or insert last touched it")
    lock_count: Optional[int] = Field(description="running requests holding it (root: null)")
    namespace: Optional[str] = Field(description="short hash of the cache_salt namespace; null: shared")
    tiers: list[Literal["pool", "host", "disk"]] = Field(default_factory=list, description=(
        "where the node's KV is (host and disk: the hierarchical cache's lower tiers; root: none)"))
    text: Optional[str] = Field(None, description="decoded preview of the edge's first tokens; only with "
                                                  "--cache-inspector-text, never for a salted node")
    text_truncated: Optional[bool] = Field(None, description="the preview shows only the edge's first tokens")
    omitted_children: int = Field(ge=0, description="children not shown (node or depth limit)")
    omitted_tokens: int = Field(ge=0, description="tokens below this node in children not shown")
    children: list["CacheNode"]


CacheKind = Literal["radix", "hierarchical", "none"]


class CacheTree(BaseModel):
    cache: CacheKind
    tree_tokens: int = Field(ge=0)
    tree_nodes: int = Field(ge=0)
    scanned_nodes: int = Field(ge=0, description="nodes counted for subtree sizes (bounded)")
    scan_complete: bool = Field(description="false: the tree was larger than the scan budget and sizes "
                                            "count only the scanned nodes")
    returned_nodes: int = Field(ge=0)
    max_depth: int = Field(ge=1)
    max_nodes: int = Field(ge=1)
    text_preview: bool = Field(description="whether the server shows text previews (--cache-inspector-text)")
    root: CacheNode


class WindowCounts(BaseModel):
    prompt_tokens: int = Field(ge=0)
    cached_tokens: int = Field(ge=0)
    requests: int = Field(ge=0, description="first admissions")
    evicted_nodes: int = Field(ge=0)
    evicted_tokens: int = Field(ge=0)
    hit_rate: Optional[float] = Field(ge=0, le=1, description="cached_tokens / prompt_tokens; null without traffic")


class Windows(BaseModel):
    last_1m: WindowCounts
    last_5m: WindowCounts
    since_start: WindowCounts


class TreeSize(BaseModel):
    tokens: int = Field(ge=0)
    nodes: int = Field(ge=0)
    evictable_tokens: int = Field(ge=0)
    protected_tokens: int = Field(ge=0, description="locked by running requests")


class KVUsage(BaseModel):
    num_slots: int = Field(ge=0)
    free_slots: int = Field(ge=0)
    cached_slots: int = Field(ge=0, description="owned by the prefix tree")
    held_slots: int = Field(ge=0, description="held by running requests outside the tree")
    used_fraction: float = Field(ge=0, le=1)


class RequestCounts(BaseModel):
    running: int = Field(ge=0)
    waiting: int = Field(ge=0)
    in_flight: int = Field(ge=0, description="requests the HTTP server is waiting on")


class HostTier(BaseModel):
    tokens: int = Field(ge=0, description="tokens whose KV the host tier holds")
    slots: int = Field(ge=0)
    hit_tokens: int = Field(ge=0, description="tokens loaded back into the pool from this tier since start")


class DiskTier(BaseModel):
    blocks: int = Field(ge=0)
    bytes: int = Field(ge=0)
    budget_bytes: int = Field(ge=0, description="0: no disk tier")
    hit_tokens: int = Field(ge=0)


class PoolTier(BaseModel):
    tokens: int = Field(ge=0)
    slots: int = Field(ge=0)


class Tiers(BaseModel):
    pool: PoolTier
    host: HostTier
    disk: DiskTier
    failed_loads: int = Field(ge=0, description="blocks that could not be read back (recomputed)")
    lost_blocks: int = Field(ge=0, description="blocks whose write failed (disk full, folder gone)")


class CacheStatsReply(BaseModel):
    cache: CacheKind
    uptime_s: float = Field(ge=0)
    windows: Windows
    tree: TreeSize
    kv: KVUsage
    requests: RequestCounts
    tiers: Optional[Tiers] = Field(None, description="the hierarchical cache's tiers (absent without it)")


ERROR_RESPONSES = {400: {"model": ErrorBody, "description": "a query parameter out of range (named)"},
                   401: {"model": ErrorBody, "description": "missing or invalid API key"},
                   403: {"model": ErrorBody, "description": "not an admin key"}}
