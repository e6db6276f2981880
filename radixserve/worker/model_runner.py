"""The model worker: weights, KV pool, its own request->token table, attention and sampling.

``ModelRunner.step(plan)`` executes one ``StepPlan`` and returns a ``StepResult``.  The same
object serves in-process (the Engine) and inside a worker process.

Under tensor parallelism (``tp``, a ``parallel.group.DistTP``) every rank runs a ModelRunner
over its shard and steps the same plans; rank 0 gets the gathered logits and samples, the
other ranks only run the forward (their ``StepResult`` has no tokens and is dropped).  The
ranks agree on rank 0's numerics and on the smallest KV pool any of them can hold.  Under
pipeline parallelism each stage's runner steps the same (micro-batch) plans over its layers
(``worker/pp/runner.py``); only the last stage has logits and samples.
"""
from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np
import torch

from radixserve.attention.base import ForwardBatch, ForwardMode
from radixserve.config import CacheConfig, ModelConfig, SchedulerConfig
from radixserve.ipc.worker_link import StepOutput, StepPlan, StepReq, StepResult, TokenLogprob
from radixserve.model import loader
from radixserve.parallel.group import NoTP
from radixserve.parallel.layout import TPLayout
from radixserve.proc import stages
from radixserve.worker.kv_setup import build_kv
from radixserve.worker.tuning.numerics_choice import resolve_numerics
from radixserve.worker.pooling import forward_pooled
from radixserve.worker.sampler import ReqSamplingState, Sampler, logprobs_of, make_state
from radixserve.worker.spec.draft_runner import DraftRunner, NoDraft
from radixserve.worker.spec.verify import verify_drafts

logger = logging.getLogger(__name__)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def context_length(config: Any, model_cfg: ModelConfig) -> int:
    return int(model_cfg.context_length or getattr(config, "max_position_embeddings", 4096))


class ModelRunner:
    def __init__(self, model_cfg: ModelConfig, cache_cfg: CacheConfig, sched_cfg: SchedulerConfig,
                 hf_dir: str, show_progress: bool = False, tp: Any = None) -> None:
        self.tp = tp or NoTP()
        self.device = resolve_device(model_cfg.device)
        if self.device.type == "cuda" and self.tp.world_size > 1:
            self.device = torch.device("cuda", torch.cuda.current_device())  # set per rank by parallel.init
        self.config = loader.load_config(hf_dir)
        self.numerics = self.tp.from_leader(resolve_numerics(model_cfg, self.device, self.config, hf_dir))
        self.dtype = self.numerics.dtype
        torch.manual_seed(model_cfg.seed)
        self.context_len = context_length(self.config, model_cfg)
        layout = TPLayout.of(self.config, self.tp.rank, self.tp.size)
        with stages.stage("weights", f"{hf_dir} as {self.numerics.describe()} on {self.device}"):
            self.model = loader.load_model(self.config, hf_dir, self.dtype, self.device, self.context_len + 1,
                                           show_progress=show_progress, quantization=self.numerics.quantization,
                                           max_m=self.numerics.max_m, tp=self.tp, layout=layout,
                                           packed=self.numerics.packed)
        self.kv = build_kv(self.model, self.config, hf_dir, cache_cfg, sched_cfg, self.dtype, self.device,
                           self.context_len, layout.num_heads, self.tp)
        self.vocab_size = self.config.vocab_size
        self.sampler = Sampler(self.vocab_size, self.device, model_cfg.seed)
        self.states: dict[str, ReqSamplingState] = {}
        # speculative decoding with a draft model: mirrors every forward, proposes when asked
        self.draft = NoDraft() if sched_cfg.speculative_algorithm != "draft" else DraftRunner(
            sched_cfg.speculative_draft_model, self.vocab_size, self.dtype, self.device, self.kv_pool.num_slots,
            self.context_len + 1, cache_cfg.attention_backend)
        self.kv.add_draft_pool(getattr(self.draft, "kv_pool", None))
        self._draft_q: dict[str, Any] = {}  # this step's draft distributions, by rid
        self.lora: Any = None  # a worker.lora.manager.LoRAManager when adapters are served (build.py)

    # the KV state's parts, as the step and the tests read them (``kv_setup.KVSetup`` owns them)
    kv_pool = property(lambda self: self.kv.pool)
    kv_layout = property(lambda self: self.kv.layout)
    req_to_token = property(lambda self: self.kv.req_to_token)
    swa_table = property(lambda self: self.kv.swa_table)
    backend = property(lambda self: self.kv.backend)

    # ------------------------------------------------------------------ one step
    def step(self, plan: StepPlan) -> StepResult:
        if self.lora is None:
            return self._step(plan)
        self.lora.begin(plan)
        try:
            return self._step(plan)
        finally:
            self.lora.end()

    def lora_request(self, req: Any) -> Any:
        """Load or unload a LoRA adapter between steps (``worker/lora/manager.py``)."""
        from radixserve.ipc.lora_link import LoRAReply

        if self.lora is None:
            return LoRAReply(error="lora_path: LoRA adapters are not enabled on this server")
        return self.lora.request(req)

    def _step(self, plan: StepPlan) -> StepResult:
        for rid in plan.release:
            self.states.pop(rid, None)
        if not plan.reqs:
            return StepResult([])
        dev = self.device
        table = self.req_to_token.table
        ids, pos, locs, rows, starts, lens = [], [], [], [], [], []
        seqs: list[int] = []
        placed = [r for r in plan.reqs if r.compute is not None]
        if placed:  # reused documents: their KV first, then the step computes the rest of each window
            self._place_documents(placed)
        for r in plan.reqs:
            n = len(r.input_ids)
            seqs.append(r.start + n)
            if r.prefix_slots is not None and r.start:
                table[r.row, : r.start] = torch.from_numpy(r.prefix_slots.astype(np.int32))
                if self.swa_table is not None:
                    self.swa_table[r.row, : r.start] = torch.from_numpy(r.prefix_swa.astype(np.int32))
            if r.init is not None:
                i = r.init
                self.states[r.rid] = make_state(i.sampling, i.seed, i.eos_ids, self.vocab_size,
                                                i.penalty_prompt_ids, i.penalty_output_ids, dev)
            rows.append(r.row)
            if r.compute is not None:
                ids.append(r.input_ids[r.compute])
                pos.append(r.start + r.compute)
                locs.append(r.slots[r.compute])
                starts.append(r.start + n - len(r.compute))
                lens.append(len(r.compute))
                continue
            ids.append(r.input_ids)
            pos.append(np.arange(r.start, r.start + n))
            locs.append(r.slots)
            starts.append(r.start)
            lens.append(n)
        locs_np = np.concatenate(locs).astype(np.int64)
        lens_t = torch.tensor(lens, dtype=torch.int64)
        starts_t = torch.tensor(starts, dtype=torch.int64)
        rows_t = torch.tensor(rows, dtype=torch.int64)
        pos_t = torch.from_numpy(np.concatenate(pos).astype(np.int64))
        locs_t = torch.from_numpy(locs_np)
        # write the new slots into this worker's request->token table in one scatter
        where = (rows_t.repeat_interleave(lens_t).to(dev), pos_t.to(dev))
        table.index_put_(where, locs_t.to(dev, torch.int32))
        swa_locs = None
        if self.swa_table is not None:
            swa_locs = torch.from_numpy(np.concatenate([r.swa_slots for r in plan.reqs]).astype(np.int64)).to(dev)
            self.swa_table.index_put_(where, swa_locs.to(torch.int32))
        start_loc = torch.cumsum(lens_t, 0) - lens_t
        drafted = [r for r in plan.reqs if r.draft_by_worker]
        if drafted:  # fills their proposed tokens in place, before the ids are gathered below
            qs = self.draft.propose(drafted, [self.states[r.rid] for r in drafted], table, self.sampler)
            self._draft_q = {r.rid: q for r, q in zip(drafted, qs)}
        batch = ForwardBatch(
            mode=ForwardMode.DECODE if plan.decode else ForwardMode.EXTEND,
            input_ids=torch.from_numpy(np.concatenate(ids).astype(np.int64)).to(dev),
            positions=pos_t.to(dev),
            out_cache_loc=locs_t.to(dev),
            req_pool_indices=rows_t.to(dev),
            seq_lens=torch.tensor(seqs, dtype=torch.int64).to(dev),
            extend_prefix_lens=starts_t.to(dev),
            extend_seq_lens=lens_t.to(dev),
            extend_start_loc=start_loc.to(dev),
            req_to_token=table,
            seq_lens_cpu=seqs,
            extend_prefix_lens_cpu=starts,
            extend_seq_lens_cpu=lens,
            swa_out_cache_loc=swa_locs,
            swa_req_to_token=self.swa_table,
            gapped_cpu=[r.compute is not None for r in plan.reqs] if placed else [],
        )
        # rows that go through the LM head: prompt-logprob rows, then each sampled last row
        logit_rows: list[int] = []
        spans: list[tuple[int, int]] = []
        pools: list[tuple[int, int, int]] = []  # embedding requests: (index, first row, rows)
        offset = 0
        for i, (r, n) in enumerate(zip(plan.reqs, lens)):
            first = len(logit_rows)
            if r.pool:
                pools.append((i, offset, n))
            if r.logprob_from >= 0:
                logit_rows.extend(range(offset + r.logprob_from, offset + n))
            elif r.num_draft:  # the verified rows: the last token's and each proposed token's
                logit_rows.extend(range(offset + n - r.num_draft - 1, offset + n))
            elif r.sample:
                logit_rows.append(offset + n - 1)
            spans.append((first, len(logit_rows)))
            offset += n
        outputs = [StepOutput(r.rid) for r in plan.reqs]
        self.backend.init_forward_metadata(batch)
        if pools:
            pooled_logits = forward_pooled(self.model, batch, self.backend, logit_rows, pools, plan.reqs, outputs)
            self.draft.mirror(batch)
            if pooled_logits is not None:  # None also on tensor-parallel ranks other than 0
                self._prompt_logprobs(plan, pooled_logits, spans, outputs)
                self._sample(plan, pooled_logits, spans, outputs)
            return StepResult(outputs)
        if not logit_rows:
            self.model(batch, self.backend, torch.empty(0, dtype=torch.int64, device=dev))
            self.draft.mirror(batch)
            return StepResult(outputs)
        logits = self.model(batch, self.backend, torch.tensor(logit_rows, dtype=torch.int64, device=dev))
        self.draft.mirror(batch)
        if logits is None:  # a tensor-parallel rank other than 0: rank 0 samples
            return StepResult(outputs)
        self._prompt_logprobs(plan, logits, spans, outputs)
        self._sample(plan, logits, spans, outputs)
        return StepResult(outputs)

    def _place_documents(self, reqs: list[StepReq]) -> None:
        """Write each window's slots into the table and copy the reused documents' KV into them."""
        from radixserve.worker.doc_kv import place_documents

        table = self.req_to_token.table
        for r in reqs:
            table[r.row, r.start: r.start + len(r.slots)] = torch.from_numpy(r.slots.astype(np.int32))
        moves = [r for r in reqs if r.reuse_src is not None and len(r.reuse_src)]
        if not moves:
            return
        cat = lambda name: torch.from_numpy(np.concatenate([getattr(r, name) for r in moves]).astype(np.int64))  # noqa: E731
        rotaries = [self.model.layer_rotary(i) for i in range(self.kv_pool.num_layers)]
        place_documents(self.kv_pool, rotaries, cat("reuse_src").to(self.device), cat("reuse_dst").to(self.device),
                        cat("reuse_shift").to(self.device))
        if any(r.doc_select == "deviation" for r in moves):  # CacheBlend: which candidates to compute
            from radixserve.worker.doc_select import choose

            choose(self.model, self.backend, self.kv_pool, table, moves, self.device)

    def _prompt_logprobs(self, plan: StepPlan, logits: torch.Tensor, spans, outputs) -> None:
        for r, (a, b), out in zip(plan.reqs, spans, outputs):
            if r.logprob_from < 0:
                continue
            targets = torch.from_numpy(np.asarray(r.logprob_targets, dtype=np.int64)).to(logits.device)
            chosen, top = logprobs_of(logits[a:b], targets, r.top_logprobs_num)
            chosen_l = chosen.tolist()
            top_v = top.values.tolist() if top is not None else None
            top_i = top.indices.tolist() if top is not None else None
            for j, t in enumerate(r.logprob_targets.tolist()):
                if t < 0:
                    continue
                alts = list(zip(top_v[j], top_i[j])) if top is not None else None
                out.prompt_logprobs.append(TokenLogprob(chosen_l[j], t, alts))

    def _sample(self, plan: StepPlan, logits: torch.Tensor, spans, outputs) -> None:
        for i, r in enumerate(plan.reqs):
            if r.num_draft:
                a, b = spans[i]
                verify_drafts(self.sampler, r, self.states[r.rid], logits[a:b], outputs[i],
                              self._draft_q.pop(r.rid, None))
        picks = [i for i, r in enumerate(plan.reqs) if r.sample and not r.num_draft]
        if not picks:
            return
        row_ids = [spans[i][1] - 1 for i in picks]
        if row_ids == list(range(logits.shape[0])):  # a decode step: every row samples, in order
            raw = logits
        else:
            raw = logits.index_select(0, torch.tensor(row_ids, dtype=torch.int64, device=logits.device))
        states = [self.states[plan.reqs[i].rid] for i in picks]
        nouts = [plan.reqs[i].num_output for i in picks]
        masks = [None if plan.reqs[i].vocab_mask is None else
                 torch.from_numpy(plan.reqs[i].vocab_mask).to(logits.device) for i in picks]
        changed = self.sampler.changes_logits(states, nouts, masks)
        processed = self.sampler.process(raw.clone(), states, nouts, masks) if changed else raw
        tokens = self.sampler.sample(processed, states, nouts)
        want = [j for j, i in enumerate(picks) if plan.reqs[i].return_logprob]
        lp_list: dict[int, TokenLogprob] = {}
        if want:
            w = torch.tensor(want, device=logits.device)
            top_n = max(plan.reqs[picks[j]].top_logprobs_num for j in want)
            chosen, top = logprobs_of(raw.index_select(0, w), tokens.index_select(0, w), top_n)
            for k, j in enumerate(want):
                n = plan.reqs[picks[j]].top_logprobs_num
                alts = list(zip(top.values[k, :n].tolist(), top.indices[k, :n].tolist())) if n else None
                lp_list[j] = TokenLogprob(float(chosen[k]), int(tokens[j]), alts)
        for j, (i, tok) in enumerate(zip(picks, tokens.tolist())):
            states[j].observe(tok)
            outputs[i].next_token = tok
            outputs[i].next_logprob = lp_list.get(j)


def set_threads(ranks_here: int = 1) -> None:
    """Use every core for intra-op parallelism (shared by the ``ranks_here`` tensor-parallel
    ranks of this machine) unless the user pinned it."""
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // ranks_here))

