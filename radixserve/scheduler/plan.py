"""Turns a scheduled request into the per-step delta the worker executes."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from radixserve.ipc.worker_link import ReqInit, StepReq
from radixserve.scheduler.documents import step_fields
from radixserve.scheduler.pooling import pool_mode
from radixserve.scheduler.req import Req


def make_step_req(req: Req, row: np.ndarray, n: int, eos_ids: tuple[int, ...],
                  draft: Sequence[int] = (), drafts_in_worker: bool = False) -> StepReq:
    """The next ``n`` tokens of ``req`` (from ``req.kv_len``), then the proposed ``draft``
    tokens to verify (speculative decoding; placeholders that the worker's draft model
    overwrites when ``drafts_in_worker``), with the slots already written to ``row``.
    The first step on a worker also carries the prefix slots and the sampling state;
    prompt-logprob rows and their target ids are attached while the prompt is being
    prefilled."""
    start = req.kv_len
    ids = req.fill_ids[start: start + n] + list(draft)
    sample = start + n == req.fill_len and req.remaining_new_tokens() > 0
    sr = StepReq(req.rid, req.row, start, np.asarray(ids, dtype=np.int64),
                 row[start: start + len(ids)].astype(np.int64), sample, len(req.output_ids),
                 return_logprob=req.return_logprob, top_logprobs_num=req.top_logprobs_num, num_draft=len(draft),
                 draft_by_worker=drafts_in_worker and bool(draft))
    if req.doc is not None:  # reused documents in this window: what to copy, what to compute
        fields = step_fields(req, start, sr.slots)
        if fields is not None:
            sr.compute, sr.reuse_src, sr.reuse_dst, sr.reuse_shift = fields
            sr.doc_select = req.doc.select
    if req.pooling is not None:
        sr.pool = pool_mode(req, start, n)
    if not req.on_worker or req.resync:
        req.resync = False
        sr.prefix_slots = row[:start].astype(np.int64)
    if not req.on_worker:
        sp = req.sampling
        pen = sp.needs_penalty()
        sr.init = ReqInit(sp, req.seed, penalty_prompt_ids=req.input_ids if pen else None,
                          penalty_output_ids=list(req.output_ids) if pen else None, eos_ids=eos_ids)
        req.on_worker = True
    if req.return_logprob and req.logprob_start_len >= 0 and start < len(req.input_ids):
        # logits at position p score the prompt token at p + 1
        first_row = max(req.logprob_start_len, 1) - 1
        lo = max(start, first_row)
        if lo < start + n:
            fill = req.fill_ids
            # rows of the computed tokens; with reused documents all those from ``lo`` on are computed
            sr.logprob_from = lo - start if sr.compute is None else len(sr.compute) - (start + n - lo)
            sr.logprob_targets = np.asarray(
                [fill[p + 1] if p + 1 < len(req.input_ids) else -1 for p in range(lo, start + n)], dtype=np.int64)
    return sr
