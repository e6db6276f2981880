"""The draft model of ``--speculative-algorithm draft``: a second, smaller causal LM in the worker.

KV: the draft has its own pool (as many slots as the target's, its own layer shapes) and
reads it through the target's request->token table, so slot ``s`` holds the draft's KV of
the token whose target KV is in the target's slot ``s``.  One allocation by the scheduler,
the prefix cache, retraction and ``KVManager.discard_rejected`` therefore govern both
models, and a cached prefix is valid for both.  Invariant: every target forward is
mirrored by the draft over the same tokens, positions and slots (``mirror``), so the
draft's KV is computed wherever the target's is.

Proposals (``propose``): each request of the step with ``num_draft = k`` drafted here feeds
its last token, then ``k`` batched draft decode steps write the proposed tokens into the
request's ``input_ids`` (in place, before the target's verify forward reads them).
Greedy requests take the draft's argmax; the others sample the draft's processed
distribution ``q`` (temperature, top-k/p, min-p, from a generator of their own), which the
worker keeps for rejection sampling (``speculative/verify.py``).
"""
from __future__ import annotations

from typing import Optional

import torch

from radixserve.attention.base import ForwardBatch, ForwardMode
from radixserve.attention.registry import create_attention_backend
from radixserve.ipc.worker_link import StepReq
from radixserve.mem_cache.kv_pool import KVPool
from radixserve.model import loader
from radixserve.speculative.verify import sample_from
from radixserve.worker.sampler import ReqSamplingState, Sampler

DRAFT_STREAM = 0x5BD1E995  # the draft's randomness: a stream apart from the verifier's


class DraftRunner:
    def __init__(self, path: str, vocab_size: int, dtype: torch.dtype, device: torch.device, num_slots: int,
                 max_positions: int, attention_backend: str) -> None:
        hf_dir = loader.resolve_hf_dir(path)
        config = loader.load_config(hf_dir)
        if config.vocab_size != vocab_size:
            raise ValueError(f"speculative_draft_model: vocabulary of {config.vocab_size} tokens, "
                             f"the target has {vocab_size}")
        self.device = device
        self.model = loader.load_model(config, hf_dir, dtype, device, max_positions)
        kv_heads, head_dim, shared = self.model.kv_cache_shape()
        self.kv_pool = KVPool(num_slots, config.num_hidden_layers, kv_heads, head_dim, dtype, device, shared)
        self.backend = create_attention_backend(attention_backend, self.kv_pool, device,
                                                layers=self.model.layer_attention())

    def mirror(self, batch: ForwardBatch) -> None:
        """Compute the draft's KV for the target's step ``batch`` (after the target ran it)."""
        self.backend.init_forward_metadata(batch)
        self.model(batch, self.backend, torch.empty(0, dtype=torch.int64, device=self.device))

    def propose(self, reqs: list[StepReq], states: list[ReqSamplingState], table: torch.Tensor,
                sampler: Sampler) -> list[Optional[torch.Tensor]]:
        """Fill the proposed tokens of ``reqs`` (``input_ids[1:]``); ``table`` already holds their
        slots.  Returns, per request, the draft's distributions [k, V] (None when greedy)."""
        dev = self.device
        ks = [r.num_draft for r in reqs]
        qs: list[list[torch.Tensor]] = [[] for _ in reqs]
        cur = [int(r.input_ids[0]) for r in reqs]
        for j in range(max(ks)):
            live = [i for i, k in enumerate(ks) if k > j]
            pos = [reqs[i].start + j for i in live]
            n = len(live)
            ones = torch.ones(n, dtype=torch.int64)
            batch = ForwardBatch(
                mode=ForwardMode.DECODE, input_ids=torch.tensor([cur[i] for i in live], device=dev),
                positions=torch.tensor(pos, device=dev),
                out_cache_loc=torch.tensor([int(reqs[i].slots[j]) for i in live], device=dev),
                req_pool_indices=torch.tensor([reqs[i].row for i in live], device=dev),
                seq_lens=torch.tensor([p + 1 for p in pos], device=dev),
                extend_prefix_lens=torch.tensor(pos, device=dev),
                extend_seq_lens=ones.to(dev), extend_start_loc=torch.arange(n, device=dev), req_to_token=table,
                seq_lens_cpu=[p + 1 for p in pos], extend_prefix_lens_cpu=pos, extend_seq_lens_cpu=[1] * n)
            self.backend.init_forward_metadata(batch)
            logits = self.model(batch, self.backend, torch.arange(n, device=dev))
            sts = [states[i] for i in live]
            steps = [reqs[i].num_output + j for i in live]
            processed = sampler.process(logits, sts, steps, [None] * n)
            for row, i in enumerate(live):
                st = states[i]
                if st.params.greedy:
                    tok = int(processed[row].argmax())
                else:
                    q = sampler.probs(processed[row: row + 1], [st])[0]
                    q = q / q.sum()
                    tok = sample_from(q, _generator(sampler, st, steps[row]))
                    qs[i].append(q)
                reqs[i].input_ids[1 + j] = tok
                cur[i] = tok
        return [torch.stack(q) if q else None for q in qs]


class NoDraft:
    """Without a draft model: nothing to mirror, and no request is drafted in the worker."""

    def mirror(self, batch: ForwardBatch) -> None:
        pass

    def propose(self, reqs, states, table, sampler):  # pragma: no cover - never asked
        raise AssertionError("a step asked the worker to draft without --speculative-algorithm draft")


def _generator(sampler: Sampler, state: ReqSamplingState, step: int) -> torch.Generator:
    if state.seed is None:
        return sampler.generator
    g = torch.Generator(device=sampler.device)
    g.manual_seed(((state.seed ^ DRAFT_STREAM) * 0x9E3779B97F4A7C15 + step) & 0x7FFFFFFFFFFFFFFF)
    return g
