"""``Engine``: the whole runtime in one process (scheduler + a local model worker).

    eng = Engine(dtype="float32", max_total_tokens=20000)
    out = eng.generate("The capital of France is", {"max_new_tokens": 16, "temperature": 0})
    for chunk in eng.generate_stream("Tell me a story", {"max_new_tokens": 64}):
        print(chunk["text"])
"""
from __future__ import annotations

import logging
from typing import Any, Iterator, Optional, Union

from radixserve.config import EngineConfig
from radixserve.detokenizer.fast_tokenizer import eos_token_ids
from radixserve.detokenizer.incremental import IncrementalDecoder, trim_stop
from radixserve.model import loader
from radixserve.sampling_params import SamplingParams
from radixserve.scheduler.kv_manager import KVManager
from radixserve.scheduler.req import Req
from radixserve.scheduler.scheduler import Scheduler
from radixserve.scheduler.stop import StopChecker
from radixserve.utils import new_rid, tune_malloc
from radixserve.worker.model_runner import ModelRunner, set_threads

logger = logging.getLogger(__name__)

Prompt = Union[str, list[str], None]
Params = Union[dict, SamplingParams, list, None]


def build_runtime(cfg: EngineConfig, show_progress: bool = False):
    """Load model, tokenizer and KV pools; returns (scheduler, runner, tokenizer, hf_dir)."""
    tune_malloc()
    set_threads()
    hf_dir = loader.resolve_hf_dir(cfg.model.path, show_progress)
    tokenizer = loader.load_tokenizer(cfg.model.tokenizer_path or hf_dir)
    if cfg.cache.page_size != 1:
        raise ValueError("page_size: only page size 1 is implemented")
    runner = ModelRunner(cfg.model, cfg.cache, cfg.scheduler, hf_dir, show_progress)
    kv = KVManager(runner.kv_pool.num_slots, runner.req_to_token.size, runner.context_len + 1, cfg.cache.disable_radix_cache)
    stops = StopChecker(eos_token_ids(tokenizer, hf_dir), tokenizer)
    sched = Scheduler(cfg.scheduler, runner, kv, runner.context_len, stops, runner.vocab_size)
    return sched, runner, tokenizer, hf_dir


class Engine:
    """In-process generation.  Keyword options are the fields of ModelConfig, CacheConfig
    and SchedulerConfig (see radixserve/config.py)."""

    def __init__(self, model: Optional[str] = None, show_progress: bool = False,
                 config: Optional[EngineConfig] = None, **kwargs: Any) -> None:
        self.config = config or EngineConfig.from_kwargs(model, **kwargs)
        self.scheduler, self.runner, self.tokenizer, self.model_path = build_runtime(self.config, show_progress)

    # ------------------------------------------------------------------ requests
    def _make_reqs(self, prompt: Prompt, sampling_params: Params, input_ids, return_logprob: bool,
                   logprob_start_len: int, top_logprobs_num: int) -> tuple[list[Req], bool]:
        if (prompt is None) == (input_ids is None):
            raise ValueError("text: give exactly one of prompt text or input_ids")
        if prompt is not None:
            batched = isinstance(prompt, list)
            prompts = prompt if batched else [prompt]
            if not all(isinstance(p, str) for p in prompts):
                raise ValueError("text: must be a string or a list of strings")
            ids_list = [self.tokenizer.encode(p) for p in prompts]
        else:
            batched = bool(input_ids) and isinstance(input_ids[0], list)
            ids_list = input_ids if batched else [input_ids]
            if not all(isinstance(t, int) for ids in ids_list for t in ids):
                raise ValueError("input_ids: must be a list of ints or a list of lists of ints")
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(ids_list)
        if len(params) != len(ids_list):
            raise ValueError("sampling_params: a list must have one entry per prompt")
        reqs = []
        for ids, p in zip(ids_list, params):
            sp = p if isinstance(p, SamplingParams) else SamplingParams.from_dict(p)
            sp.verify(self.runner.vocab_size)
            for i in range(sp.n):
                copy = SamplingParams(**{**sp.__dict__, "n": 1})
                seed = None if sp.seed is None else sp.seed + i
                reqs.append(Req(new_rid(), list(ids), copy, seed, return_logprob, logprob_start_len, top_logprobs_num))
        for r in reqs:
            self.scheduler.validate(r)
        return reqs, batched or len(reqs) > 1

    def generate(self, prompt: Prompt = None, sampling_params: Params = None, input_ids=None,
                 return_logprob: bool = False, logprob_start_len: int = -1, top_logprobs_num: int = 0):
        """Run to completion; returns one result dict, or a list for batched input / n > 1."""
        reqs, batched = self._make_reqs(prompt, sampling_params, input_ids, return_logprob,
                                        logprob_start_len, top_logprobs_num)
        for r in reqs:
            self.scheduler.add_request(r)
        while any(not r.finished for r in reqs):
            self.scheduler.step()
        outs = [self.result(r) for r in reqs]
        return outs if batched else outs[0]

    def generate_stream(self, prompt: Prompt = None, sampling_params: Params = None, input_ids=None,
                        return_logprob: bool = False, logprob_start_len: int = -1,
                        top_logprobs_num: int = 0) -> Iterator[dict]:
        """Yield result dicts with the cumulative ``text`` after every step that adds
        readable text; ``index`` tells which request a chunk belongs to."""
        reqs, _ = self._make_reqs(prompt, sampling_params, input_ids, return_logprob, logprob_start_len,
                                  top_logprobs_num)
        decoders = {r.rid: IncrementalDecoder(self.tokenizer, r.sampling.skip_special_tokens) for r in reqs}
        index = {r.rid: i for i, r in enumerate(reqs)}
        sent = {r.rid: 0 for r in reqs}
        for r in reqs:
            self.scheduler.add_request(r)
        try:
            while any(not r.finished for r in reqs):
                for r in self.scheduler.step():
                    if r.rid not in decoders:
                        continue
                    dec = decoders[r.rid]
                    delta = dec.add(r.output_ids[sent[r.rid]:])
                    sent[r.rid] = len(r.output_ids)
                    if r.finished:
                        yield {**self.result(r), "index": index[r.rid]}
                    elif delta:
                        yield {"text": trim_stop(dec.text, r.finish_reason), "output_ids": list(r.output_ids),
                               "meta_info": self._meta(r), "index": index[r.rid]}
        finally:
            for r in reqs:
                if not r.finished:
                    self.scheduler.abort(r.rid, "stream closed")

    # ------------------------------------------------------------------ outputs
    def result(self, req: Req) -> dict:
        text = self.tokenizer.decode(req.output_ids, skip_special_tokens=req.sampling.skip_special_tokens)
        return {"text": trim_stop(text, req.finish_reason), "output_ids": list(req.output_ids),
                "meta_info": self._meta(req)}

    def _meta(self, req: Req) -> dict:
        meta = {"id": req.rid, "finish_reason": dict(req.finish_reason) if req.finish_reason else None,
                "prompt_tokens": len(req.input_ids), "completion_tokens": len(req.output_ids),
                "cached_tokens": req.cached_tokens}
        if req.return_logprob:
            meta["input_token_logprobs"] = [None if t is None else (t.logprob, t.token_id, None)
                                            for t in req.input_logprobs]
            meta["output_token_logprobs"] = [(t.logprob, t.token_id, None) for t in req.output_logprobs]
            if req.top_logprobs_num:
                meta["input_top_logprobs"] = [None if t is None else [(lp, i, None) for lp, i in t.top]
                                              for t in req.input_logprobs]
                meta["output_top_logprobs"] = [[(lp, i, None) for lp, i in t.top] for t in req.output_logprobs]
        return meta

    # ------------------------------------------------------------------ admin
    def flush_cache(self) -> bool:
        return self.scheduler.flush_cache()

    def stats(self) -> dict:
        return self.scheduler.stats()

    def check_invariants(self) -> None:
        self.scheduler.check_invariants()
