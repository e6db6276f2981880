"""Builds the scheduler over a model worker, from the ``WorkerInfo`` that worker reported.

Used by the scheduler process (over a ``RemoteWorker``) and by the in-process ``Engine`` (over
the local ``ModelRunner``).  ``new_req`` turns a validated ``TokenizedRequest`` (see
``radixserve.request_builder``) into the scheduler's ``Req``.
"""
from __future__ import annotations

from typing import Any, Optional

from radixserve.config import EngineConfig
from radixserve.tokenizer import eos_token_ids
from radixserve.ipc.server_link import TokenizedRequest
from radixserve.ipc.worker_link import WorkerInfo
from radixserve.mem_cache.hiradix_cache import TierLink, TierSpec
from radixserve.reasoning.formats import reasoning_format, think_token_ids
from radixserve.scheduler.kv_manager import KVManager
from radixserve.scheduler.req import Req
from radixserve.scheduler.scheduler import Scheduler, Worker
from radixserve.scheduler.stop import StopChecker
from radixserve.speculative.strategy import make_speculator


def build_scheduler(cfg: EngineConfig, worker: Worker, info: WorkerInfo, tokenizer: Any,
                    tier_link: Optional[TierLink] = None) -> Scheduler:
    """A ``Scheduler`` driving ``worker`` with the pool sizes ``info`` reports; ``tier_link``:
    the worker's host and disk tiers when the hierarchical cache is on.  With a reasoning parser,
    ValueError when ``tokenizer`` lacks its think tags (radixserve/reasoning/formats.py)."""
    swa = (info.swa_slots, info.swa_window) if info.swa_slots else None
    tiers = None
    if info.host_tier_slots and tier_link is not None:
        tiers = TierSpec(tier_link, info.host_tier_slots, cfg.cache.disk_tier_bytes, info.kv_bytes_per_slot,
                         cfg.cache.hicache_write_policy == "write_through")
    kv = KVManager(info.num_slots, info.max_rows, info.context_len + 1, cfg.cache.disable_radix_cache, swa, tiers)
    stops = StopChecker(eos_token_ids(tokenizer, info.hf_dir), tokenizer)
    sched = Scheduler(cfg.scheduler, worker, kv, info.context_len, stops, info.vocab_size,
                      make_speculator(cfg.scheduler.speculative_algorithm))
    if info.lora is not None:
        sched.lora.max_loras = info.lora.max_loras_per_batch
    sched.doc_refusal = info.doc_reuse_refusal
    if cfg.scheduler.reasoning_parser != "none":  # ValueError (one line) when the tokenizer lacks the tags
        sched.grammars.think_end_id = think_token_ids(reasoning_format(cfg.scheduler.reasoning_parser), tokenizer)[1]
    return sched


def new_req(msg: TokenizedRequest) -> Req:
    """The scheduler's ``Req`` for one validated sequence (its prompt and document spans are copied)."""
    spans = None if msg.doc_spans is None else [tuple(s) for s in msg.doc_spans]
    return Req(msg.rid, list(msg.input_ids), msg.sampling, msg.seed, msg.return_logprob, msg.logprob_start_len,
               msg.top_logprobs_num, pooling=msg.pooling, doc_spans=spans)
