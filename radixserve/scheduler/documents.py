"""Order-free document reuse (issue 46): a prompt's marked documents reuse KV computed once per
document, wherever the prompt places them, with a share of their tokens recomputed.

How a request with ``doc_spans`` runs:

1. **Documents computed alone.**  Each document is prefilled once, after the prompt's
   ``preamble`` only (the tokens before its first document: the system prompt and instruction a
   RAG pipeline repeats), by an internal request (``max_new_tokens`` 0) whose KV the radix tree
   keeps under the document namespace ``document_salt`` (the request's salt and LoRA adapter kept
   apart, as every namespace is): evictable, in the tiers, in the inspector, like any cached
   prefix; the documents of one preamble share its path.  A document right after the preamble is
   then reused exactly, and the others have seen the system prompt (and its attention sink).  The
   request waits (``pending``) until its documents are computed or failed.
2. **Placement at admission** (``place``): after the exact prefix match, each document span past
   it is looked up in the document namespace.  Its first ``round(share * n)`` tokens are
   recomputed (EPIC's repair of the per-document attention sink; ``share`` is
   ``sampling.document_recompute`` or the server's ``document_recompute``); the rest are reused.
   With ``select`` "deviation" (``sampling.document_select`` or the server's ``document_select``)
   every document token with cached KV is a candidate (``reuse_*``), its first ones marked computed
   (``recompute_pos``), and the worker may compute other candidates instead, as many per window
   (``worker/doc_select.py``, CacheBlend's choice by KV deviation); the candidates' KV is copied:
   their KV is copied into the request's own slots with the keys rotated from where they were
   computed to the span's position (``worker/doc_kv.py``).  Non-document tokens and the last prompt token
   are always computed.  The documents' tree nodes stay locked until the request releases its row.
3. **Steps over windows** (``window``): a chunk of the prompt is a window of the row; the step
   computes the window's recomputed tokens at their positions (each attends to the row's keys up
   to its position) after the worker has copied the reused ones.  A window ends at a computed
   token, so every step computes at least one.
4. **Approximate KV stays out of the tree**: the row is cached only up to ``blend_from`` (the
   first reused token); what follows is freed with the row.  A share of 1 reuses nothing: the
   request is a plain prefill and caches as one.

Refused, with the reason in ``Req.doc_fallback`` (the documents are then prefilled as plain
prompt tokens, exactly as without marks): a worker that cannot move keys (``WorkerInfo
.doc_reuse_refusal``), prompt logprobs, embeddings.  Scheduler thread only.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from radixserve.mem_cache.tree_node import TreeNode
from radixserve.sampling_params import SamplingParams
from radixserve.scheduler.req import Req

DOC_SALT = "\x00doc"


def document_salt(req: Req) -> str:
    """The namespace of ``req``'s documents (its own salt kept apart; the LoRA adapter is added by
    ``Req.cache_salt`` as for every request)."""
    return DOC_SALT + ("" if req.sampling.cache_salt is None else "\x00" + req.sampling.cache_salt)


@dataclass
class DocState:
    """A request's document bookkeeping: the internal requests it waits for, then its placement."""

    pending: set[str] = field(default_factory=set)
    share: float = 0.15
    select: str = "first"  # "deviation": the worker picks which candidates to compute
    reuse_pos: Optional[np.ndarray] = None  # sorted prompt positions whose KV is copied
    reuse_src: Optional[np.ndarray] = None  # the document slot of each
    reuse_shift: Optional[np.ndarray] = None  # the rotary shift of each (the span's start)
    recompute_pos: Optional[np.ndarray] = None  # sorted reuse_pos computed all the same ("deviation")
    nodes: list[TreeNode] = field(default_factory=list)  # locked document nodes
    computed: Optional[np.ndarray] = None  # sorted prompt positions the steps compute (from the match on)

    @property
    def blend_from(self) -> Optional[int]:
        """The first reused position (the row is cached only before it), None without reuse."""
        return int(self.reuse_pos[0]) if self.reuse_pos is not None and len(self.reuse_pos) else None


def fallback_reason(req: Req, refusal: Optional[str]) -> Optional[str]:
    """Why ``req``'s documents run as plain prompt tokens, or None when they can be reused."""
    if refusal is not None:
        return refusal
    if req.pooling is not None:
        return "an embedding request"
    if req.return_logprob and 0 <= req.logprob_start_len < len(req.input_ids) \
            and req.logprob_start_len - 1 < max(e for _, e in req.doc_spans or [(0, 0)]):
        return "prompt logprobs from inside a document (ask them from after the last document)"
    return None


def doc_request_id(salt: Optional[str], tokens: list[int]) -> str:
    digest = hashlib.blake2b(np.asarray(tokens, dtype=np.int64).tobytes() + (salt or "").encode(),
                             digest_size=12).hexdigest()
    return f"doc:{digest}"


def preamble(req: Req) -> list[int]:
    """The prompt tokens before its first document: the context each document is computed in."""
    return req.input_ids[: req.doc_spans[0][0]] if req.doc_spans else []


def internal_request(parent: Req, span: tuple[int, int]) -> Req:
    """The internal request that computes document ``span`` of ``parent`` after the preamble alone."""
    tokens = preamble(parent) + parent.input_ids[span[0]: span[1]]
    sampling = SamplingParams(max_new_tokens=0, cache_salt=document_salt(parent), lora_path=parent.sampling.lora_path,
                              priority=parent.sampling.priority)
    req = Req("", list(tokens), sampling, internal=True)
    req.rid = doc_request_id(req.cache_salt, tokens)
    return req


def place(req: Req, exact: int, lookup: Callable, unlock: Callable) -> None:
    """Decide ``req``'s reuse after an exact prefix match of ``exact`` tokens.  ``lookup(tokens,
    salt)`` returns (the document's cached slots from its start, its node, locked) or None;
    ``unlock(node)`` drops a lock not needed.  Fills ``req.doc`` (the locked nodes in ``nodes``)
    and the counters."""
    st: DocState = req.doc
    last = req.fill_len - 1  # its logits give the next token: always computed
    pre = preamble(req)
    pos, src, shift, first = [], [], [], []
    candidates = st.select == "deviation"
    recomputed = 0
    for s, e in req.doc_spans or ():
        if e <= exact:
            continue
        lo = max(s, exact)
        k = int(round(st.share * (e - s)))
        found = lookup(pre + req.input_ids[s:e], document_salt(req)) if k < e - s else None
        m = 0 if found is None else len(found[0]) - len(pre)  # of the document's own tokens
        a, b = max(lo, s + k), min(e, s + m, last)
        if a < b:  # computed at len(pre).., placed at s..
            a0 = lo if candidates else a  # (candidates: the first ones too, computed unless the worker swaps)
            pos.append(np.arange(a0, b))
            first.append(np.arange(a0, a))
            src.append(np.asarray(found[0][len(pre) + a0 - s: len(pre) + b - s], dtype=np.int64))
            shift.append(np.full(b - a0, s - len(pre), dtype=np.int64))
            st.nodes.append(found[1])
        elif found is not None:
            unlock(found[1])
        recomputed += (e - lo) - max(0, b - a)
    if pos:
        st.reuse_pos, st.reuse_src, st.reuse_shift = np.concatenate(pos), np.concatenate(src), np.concatenate(shift)
        st.recompute_pos = np.concatenate(first).astype(np.int64)
        mask = np.ones(req.fill_len - exact, dtype=bool)
        mask[st.reuse_pos - exact] = False
        mask[st.recompute_pos - exact] = True
        st.computed = exact + np.nonzero(mask)[0]
    req.doc_reused = 0 if st.reuse_pos is None else len(st.reuse_pos) - len(st.recompute_pos)
    req.doc_recomputed = recomputed


def clear_placement(req: Req) -> list[TreeNode]:
    """Forget ``req``'s placement (its row is released); returns the nodes to unlock."""
    st: Optional[DocState] = req.doc
    if st is None:
        return []
    nodes, st.nodes = st.nodes, []
    st.reuse_pos = st.reuse_src = st.reuse_shift = st.recompute_pos = st.computed = None
    return nodes


def window(req: Req, start: int, compute: int) -> int:
    """How many row tokens from ``start`` a step computing at most ``compute`` of them covers: up
    to and including its ``compute``-th computed token (the whole rest when that is all)."""
    st: Optional[DocState] = req.doc
    rest = req.fill_len - start
    if st is None or st.computed is None:
        return min(rest, compute)
    todo = st.computed[np.searchsorted(st.computed, start):]
    if compute >= len(todo):
        return rest
    return int(todo[compute - 1]) + 1 - start


def to_compute(req: Req, start: int) -> int:
    """How many of the row tokens from ``start`` to the end of the prompt steps will compute."""
    st: Optional[DocState] = req.doc
    if st is None or st.computed is None:
        return req.fill_len - start
    return len(st.computed) - int(np.searchsorted(st.computed, start))


def step_fields(req: Req, start: int, slots: np.ndarray) -> Optional[tuple[np.ndarray, ...]]:
    """(compute, reuse_src, reuse_dst, reuse_shift) of the window at ``start`` (``slots``: its row
    slots), or None when the window computes every token.  ``compute`` and the reused slots overlap
    in the candidates computed all the same (``select`` "deviation")."""
    st: Optional[DocState] = req.doc
    if st is None or st.reuse_pos is None:
        return None
    end = start + len(slots)
    i, j = np.searchsorted(st.reuse_pos, [start, end])
    if i == j:
        return None
    keep = np.ones(len(slots), dtype=bool)
    at = st.reuse_pos[i:j] - start
    keep[at] = False
    if st.recompute_pos is not None and len(st.recompute_pos):
        u, v = np.searchsorted(st.recompute_pos, [start, end])
        keep[st.recompute_pos[u:v] - start] = True
    return (np.nonzero(keep)[0].astype(np.int64), st.reuse_src[i:j], slots[at].astype(np.int64),
            st.reuse_shift[i:j])


class DocumentRequests:
    """The internal requests computing documents alone, and the requests waiting for them."""

    def __init__(self) -> None:
        self._running: dict[str, Req] = {}  # rid -> its internal request
        self._waiters: dict[str, list[Req]] = {}
        self.used = False  # a request marked documents (the scheduler filters outputs from then on)

    def add(self, req: Req, kv, default_share: float, refusal: Optional[str],
            default_select: str = "first") -> list[Req]:
        """Set up ``req.doc`` (or ``req.doc_fallback`` with every document token recomputed);
        returns the internal requests to queue for documents not cached yet (one per distinct
        document, shared with the requests already waiting for it)."""
        self.used = True
        reason = fallback_reason(req, refusal) or ("the prefix cache is disabled" if kv.cache_kind == "none" else None)
        if reason is not None:
            req.doc_fallback = reason
            req.doc_recomputed = sum(e - s for s, e in req.doc_spans or ())
            return []
        share = req.sampling.document_recompute
        select = req.sampling.document_select or default_select
        req.doc = DocState(share=default_share if share is None else float(share), select=select)
        if req.doc.share >= 1.0:
            return []  # everything recomputed: a plain prefill
        new = []
        for span in req.doc_spans or ():
            doc = internal_request(req, span)
            if doc.rid in self._running:
                self._waiters[doc.rid].append(req)
            elif kv.document_cached(doc.input_ids, doc.cache_salt):
                continue
            else:
                self._running[doc.rid] = doc
                self._waiters[doc.rid] = [req]
                new.append(doc)
            req.doc.pending.add(doc.rid)
        return new

    def finished(self, req: Req) -> bool:
        """Note a finished request; True when it was an internal one (its waiters may go on)."""
        if not req.internal:
            return False
        if self._running.get(req.rid) is req:
            del self._running[req.rid]
            for waiter in self._waiters.pop(req.rid, []):
                if waiter.doc is not None:
                    waiter.doc.pending.discard(req.rid)
        return True
