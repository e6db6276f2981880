"""The per-step work plan of the native CPU attention kernel (``kernels/cpu/paged_attention.cpp``).

Built once per step (all layers share it) from host-side sizes, with no per-layer work:

* **Tasks** ``int32 [n, 5]``: (request row, key start, key end, first entry, end entry).  A
  task's keys are ``req_to_token[row, start:end]``; its entries are query tokens
  (``entry_tok``), each attending causally to those keys.
* **Shared prefixes.**  Requests whose rows start with the same KV slots (a radix-cache hit
  shared by the batch) form a group when two or more share at least ``min_shared`` leading
  slots: one task covers the group's common prefix for all its members' tokens, so those
  K/V are read once per step; each member then gets its own task for the rest of its row.
* **Query blocks.**  A task holds at most ``max_rows // heads_per_kv`` entries (the kernel's
  tile of query rows); longer lists become several tasks over the same keys.
* **KV splits.**  When there are too few (task, KV head) items to keep every thread busy
  (decode of one or two requests), long key ranges are split so the threads share them.
* **Dense groups.**  A shared prefix with at least ``dense_min_rows`` query rows per KV head
  (an extend step of many members) is left out of the tasks: ``dense`` lists it, with one
  entry per member token numbered before every task's, for the caller to fill with a dense
  matmul attention (``cpu_backend.py``: torch's flash attention, AMX/AVX-512 bf16 GEMMs,
  ran 4.5x the kernel's fp32-tile rate on such blocks).  Every member token comes after the
  prefix (its position >= the prefix length), so no mask is needed there.  Likewise a
  request's own keys when they are exactly its new tokens (a prompt with nothing cached past
  the shared prefix) and they make as many rows: a causal square block.
* **Sliding windows.**  A layer with a window ``W`` (a token at position p sees keys
  p - W + 1 .. p) gets its own plan: each task's key range is cut to the keys one of its
  entries sees (tasks left with none are dropped, shared prefixes wholly left of every
  member's window among them), before the KV splits, so the threads share the work that is
  left.  A dense block stays only where the window hides none of its keys (a shared prefix
  whose members sit below position W, a causal block of at most W tokens); the kernel masks
  the rest per token.
* ``tok_ptr``/``tok_entries`` (CSR) list each token's entries for the kernel's merge pass.
  Every token has at least one entry that sees its own position (its own keys' task, cut
  or not), so the merge is never empty.

Tasks are ordered by decreasing cost (keys x entries) for the kernel's dynamic scheduling.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np
import torch

KV_SPLIT_MIN = 128  # keys per split at least


@dataclass
class CpuAttnPlan:
    tasks: torch.Tensor  # int32 [n, 5]
    entry_tok: torch.Tensor  # int32 [E]
    tok_ptr: torch.Tensor  # int32 [T + 1]
    tok_entries: torch.Tensor  # int32 [E]
    num_shared_groups: int = 0
    # (request row, key start, key end, first entry, tokens int64, causal) of each dense block
    dense: list[tuple[int, int, int, int, torch.Tensor, bool]] = field(default_factory=list)
    # the KV slots of each dense block (int64), gathered once per step by the backend
    dense_slots: list[torch.Tensor] = field(default_factory=list)


def shared_groups(rows: np.ndarray, seq_lens: np.ndarray, min_shared: int) -> list[tuple[list[int], int]]:
    """(member request indices, shared length) for every group of >= 2 requests whose rows
    ``rows [B, L]`` agree on at least ``min_shared`` leading slots (within every member's length)."""
    bsz = rows.shape[0]
    if bsz < 2:
        return []
    _, first_idx, inv = np.unique(rows[:, 0], return_index=True, return_inverse=True)
    inv = inv.reshape(-1)
    counts = np.bincount(inv)
    if counts.max() < 2:
        return []
    leader = first_idx[inv]
    width = rows.shape[1]
    valid = np.arange(width)[None, :] < np.minimum(seq_lens, seq_lens[leader])[:, None]
    same = (rows == rows[leader]) & valid
    lcp = np.where(same.all(1), valid.sum(1), same.argmin(1))
    out = []
    for g in np.nonzero(counts >= 2)[0]:
        members = np.nonzero(inv == g)[0]
        plen = int(lcp[members].min())
        if plen >= min_shared:
            out.append((members.tolist(), plen))
    return out


def build_plan(rows: np.ndarray, req_rows: np.ndarray, seq_lens: np.ndarray, ext_lens: np.ndarray,
               start_loc: np.ndarray, heads_per_kv: int, num_kv_heads: int, num_threads: int,
               min_shared: int = 32, max_rows: int = 128, dense_min_rows: int = 0,
               dense_causal_min_rows: Optional[int] = None, window: Optional[int] = None,
               gapped: Sequence[bool] = ()) -> CpuAttnPlan:
    """``rows [B, >= max(seq_lens)]``: each request's slots (for prefix detection only);
    ``req_rows [B]`` its row in req_to_token; ``start_loc``/``ext_lens``: its packed tokens;
    ``dense_min_rows``: see "Dense groups" (0: none); ``dense_causal_min_rows``: the same for
    a prompt's own causal block (default: ``dense_min_rows``); ``window``: the plan of a layer
    with that sliding window (see "Sliding windows"; None: none); ``gapped[i]``: request i's
    tokens are a subset of its window at their own positions (``ForwardBatch.gapped_cpu``):
    no causal square block for it (the kernel masks each token by its position)."""
    causal_min = dense_min_rows if dense_causal_min_rows is None else dense_causal_min_rows
    # Python ints and ranges below, numpy only for the whole-array steps: numpy scalar arithmetic
    # costs ~0.1 us an operation, which made this function ~0.15 ms of a batch-64 decode step
    bsz = len(seq_lens)
    block = max(1, max_rows // heads_per_kv)
    seq, ext, start, req = seq_lens.tolist(), ext_lens.tolist(), start_loc.tolist(), req_rows.tolist()
    own_from = [0] * bsz
    ranges: list[tuple[int, int, int, Sequence[int]]] = []  # (row, key start, key end, tokens)
    dense_blocks: list[tuple[int, int, int, Sequence[int], bool]] = []
    num_groups = 0
    for members, plen in shared_groups(rows, seq_lens, min_shared):
        toks = [t for i in members for t in range(start[i], start[i] + ext[i])]
        after_prefix = all(seq[i] - ext[i] >= plen for i in members)
        unwindowed = window is None or max(seq[i] for i in members) <= window  # every member token sees key 0
        if dense_min_rows > 0 and len(toks) * heads_per_kv >= dense_min_rows and after_prefix and unwindowed:
            dense_blocks.append((req[members[0]], 0, plen, toks, False))
        else:
            ranges.append((req[members[0]], 0, plen, toks))
        for i in members:
            own_from[i] = plen
        num_groups += 1
    for i in range(bsz):
        if own_from[i] < seq[i]:
            toks = range(start[i], start[i] + ext[i])
            square = own_from[i] == seq[i] - ext[i] and (window is None or ext[i] <= window) \
                and not (gapped and gapped[i])
            if causal_min > 0 and square and ext[i] * heads_per_kv >= causal_min:
                dense_blocks.append((req[i], own_from[i], seq[i], toks, True))
            else:
                ranges.append((req[i], own_from[i], seq[i], toks))
    tasks: list[tuple[int, int, int, Sequence[int]]] = []
    for row, ks, ke, toks in ranges:
        if 0 < len(toks) <= block:
            tasks.append((row, ks, ke, toks))
            continue
        for b in range(0, len(toks), block):
            tasks.append((row, ks, ke, toks[b: b + block]))
    if window is not None:
        tasks = _cut_to_window(tasks, seq, ext, start, window)
    want = 4 * num_threads
    if len(tasks) * num_kv_heads < want:
        split_tasks = []
        for row, ks, ke, toks in tasks:
            parts = min(max(1, (ke - ks) // KV_SPLIT_MIN), -(-want // (len(tasks) * num_kv_heads)))
            edges = np.linspace(ks, ke, parts + 1).astype(np.int64).tolist()
            split_tasks.extend((row, a, b, toks) for a, b in zip(edges[:-1], edges[1:]))
        tasks = split_tasks
    tasks.sort(key=lambda t: -(t[2] - t[1]) * len(t[3]))
    table: list[tuple[int, int, int, int, int]] = []
    pieces: list[Sequence[int]] = []
    dense = []
    e = 0
    for row, ks, ke, toks, causal in dense_blocks:
        idx = torch.arange(toks.start, toks.stop) if isinstance(toks, range) else torch.tensor(toks, dtype=torch.int64)
        dense.append((row, ks, ke, e, idx, causal))
        pieces.append(toks)
        e += len(toks)
    for row, ks, ke, toks in tasks:
        table.append((row, ks, ke, e, e + len(toks)))
        pieces.append(toks)
        e += len(toks)
    entry_tok = np.fromiter(itertools.chain.from_iterable(pieces), dtype=np.int32, count=e)
    num_tokens = sum(ext)
    order = np.argsort(entry_tok, kind="stable").astype(np.int32)
    tok_ptr = np.zeros(num_tokens + 1, dtype=np.int32)
    np.cumsum(np.bincount(entry_tok, minlength=num_tokens), out=tok_ptr[1:])
    table_np = np.array(table, dtype=np.int32).reshape(len(table), 5)
    return CpuAttnPlan(torch.from_numpy(table_np), torch.from_numpy(entry_tok), torch.from_numpy(tok_ptr),
                       torch.from_numpy(order), num_groups, dense)


def _cut_to_window(tasks: list[tuple[int, int, int, Sequence[int]]], seq: list[int], ext: list[int],
                   start: list[int], window: int) -> list[tuple[int, int, int, Sequence[int]]]:
    """Each task's key range cut to the keys one of its tokens sees under ``window`` (from the
    first token's window start to the last token's position); tasks left with none dropped."""
    tok_pos = [0] * sum(ext)
    for i in range(len(seq)):
        tok_pos[start[i]: start[i] + ext[i]] = range(seq[i] - ext[i], seq[i])
    cut = []
    for row, ks, ke, toks in tasks:
        pos = [tok_pos[t] for t in toks]
        lo, hi = max(ks, min(pos) - window + 1), min(ke, max(pos) + 1)
        if lo < hi:
            cut.append((row, lo, hi, toks))
    return cut
