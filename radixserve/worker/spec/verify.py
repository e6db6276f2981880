"""The worker's half of speculative decoding: verify proposed tokens against the logits.

For a ``StepReq`` with ``num_draft = k`` the model runner keeps the logits of its last
``k + 1`` rows; ``verify_drafts`` processes each row as the sampler would process that
output position (logit bias, min_new_tokens with the row's own output count), applies the
acceptance rule of ``radixserve/speculative/verify.py`` (greedy, or rejection sampling with
row ``j`` drawing from the request's generator for output token ``num_output + j``), and
fills the ``StepOutput``: ``spec_ids`` (accepted), ``next_token`` (the target's own), and
their logprobs (of the raw logits, as for a normal decode step) when asked.  Requests with
penalties never come here (the scheduler does not speculate for them); a constrained
request brings one grammar mask per row (``vocab_mask`` [k + 1, V]).
"""
from __future__ import annotations

from typing import Optional

import torch

from radixserve.ipc.worker_link import StepOutput, StepReq, TokenLogprob
from radixserve.speculative.verify import greedy_accept, rejection_accept
from radixserve.worker.sampler import ReqSamplingState, Sampler, logprobs_of


def verify_drafts(sampler: Sampler, r: StepReq, state: ReqSamplingState, raw: torch.Tensor, out: StepOutput,
                  draft_probs: Optional[torch.Tensor] = None) -> None:
    """``raw``: fp32 logits [k + 1, V] of the request's verified rows; ``draft_probs`` [k, V]
    the draft model's distributions (None: point-mass proposals, or a greedy request)."""
    k = r.num_draft
    drafts = r.input_ids[-k:].tolist()
    steps = [r.num_output + j for j in range(k + 1)]
    states = [state] * (k + 1)
    masks = [None] * (k + 1) if r.vocab_mask is None else list(torch.from_numpy(r.vocab_mask).to(raw.device))
    processed = sampler.process(raw.clone(), states, steps, masks)
    if state.params.greedy:
        emitted = greedy_accept(drafts, processed.argmax(dim=-1).tolist())
    else:
        probs = sampler.probs(processed, states)
        gens = [sampler.generator_for(state, s) for s in steps]
        emitted = rejection_accept(probs, drafts, gens, draft_probs)
    for tok in emitted:
        state.observe(tok)
    lps: list[TokenLogprob] = []
    if r.return_logprob:
        n = len(emitted)
        chosen, top = logprobs_of(raw[:n], torch.tensor(emitted, device=raw.device), r.top_logprobs_num)
        for j, tok in enumerate(emitted):
            alts = list(zip(top.values[j].tolist(), top.indices[j].tolist())) if top is not None else None
            lps.append(TokenLogprob(float(chosen[j]), tok, alts))
    out.spec_ids = emitted[:-1]
    out.next_token = emitted[-1]
    if lps:
        out.spec_logprobs, out.next_logprob = lps[:-1], lps[-1]
