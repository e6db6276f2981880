"""Turn scheduler-side request progress into ``ReqOutput`` deltas for the detokenizer.

Contract: for every request, the concatenation of the ``new_ids`` of its outputs equals
its ``output_ids``, and exactly one output (the last) carries ``finish_reason``.  With
``return_logprob`` the prompt logprobs travel with the first output (the prompt is then
computed: a streaming client can show them first) and again with the last if they changed
(an abort mid-prompt); an embedding
request's pooled vector travels with its last output.
"""
from __future__ import annotations

from typing import Optional

from radixserve.ipc.server_link import ReqOutput
from radixserve.scheduler.pooling import embedding_of
from radixserve.scheduler.req import Req


def take_output(req: Req, step_start: Optional[float]) -> Optional[ReqOutput]:
    """The delta since the previous call for ``req``; None when there is nothing new."""
    sent, sent_lp = req.sent_ids, req.sent_lps
    new_ids = req.output_ids[sent:]
    if req.queue_time is None and step_start is not None and req.arrival is not None:
        req.queue_time = max(0.0, step_start - req.arrival)  # first step it took part in
    if not new_ids and not req.finished:
        return None
    queue_time = None
    if not req.started:
        req.started = True
        queue_time = req.queue_time
    out = ReqOutput(
        rid=req.rid, new_ids=list(new_ids), finish_reason=dict(req.finish_reason) if req.finish_reason else None,
        prompt_tokens=len(req.input_ids), cached_tokens=req.cached_tokens, completion_tokens=len(req.output_ids),
        document_reused_tokens=req.doc_reused, document_recomputed_tokens=req.doc_recomputed,
        document_fallback=req.doc_fallback,
        queue_time=queue_time, spec_proposed=req.spec_proposed, spec_accepted=req.spec_accepted,
        new_output_logprobs=list(req.output_logprobs[sent_lp:]),
        skip_special_tokens=req.sampling.skip_special_tokens, stop_strs=tuple(req.sampling.stop_strs),
        stop_regex=tuple(req.sampling.stop_regex_strs), no_stop_trim=req.sampling.no_stop_trim)
    if req.return_logprob and (req.sent_input_lps < 0 or (req.finished and len(req.input_logprobs) != req.sent_input_lps)):
        req.sent_input_lps = len(req.input_logprobs)
        out.input_logprobs = list(req.input_logprobs)
    if req.finished and req.pooling is not None:
        out.embedding = embedding_of(req)
    req.sent_ids = len(req.output_ids)
    req.sent_lps = len(req.output_logprobs)
    return out
