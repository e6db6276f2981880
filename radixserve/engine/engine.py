"""``Engine``: the whole runtime in one process (scheduler + a local model worker).

    eng = Engine(dtype="float32", max_total_tokens=20000)
    out = eng.generate("The capital of France is", {"max_new_tokens": 16, "temperature": 0})
    for chunk in eng.generate_stream("Tell me a story", {"max_new_tokens": 64}):
        print(chunk["text"])
    out = eng.generate(segments=[{"text": "Context:"}, {"text": doc, "document": True}, {"text": question}])

Thread-safe: the ``EngineDriver``'s one thread builds the model and runs every step (torch's
OpenMP teams: a second thread running torch work slowed decode 2x, see ``engine/driver.py``);
``generate``, ``generate_stream``, their async variants and the admin calls may come from any
thread at once and wait for it.  Requests go through the same front door (``RequestBuilder``) and output path
(incremental detokenizer, ``OutputState``) as the server, so results and ``meta_info`` have
the shape of the server's /generate.  Invalid input raises ValueError naming the field, in
the calling thread; a full queue raises OverflowError.  ``shutdown()`` (or leaving a ``with``
block) stops the driver; it also stops when the Engine is garbage-collected.  With
``cache_persist_dir`` the persisted prefixes are loaded at construction and saved by
``shutdown()`` (or ``persist_cache()``); the interval writer is the server's only.

``Engine("ORG/NAME")`` fetches the model from the Hugging Face Hub first (``model/hub.py``); a
failure there raises ``HubError`` (an OSError) with one line saying why.

Tensor parallelism (``tp_size > 1``): the model runs in child processes, one per rank
(``worker/tp/group_worker.py``; rank 0 broadcasts each plan and returns the results), and
``runner`` is the ``RemoteWorker`` that talks to rank 0; ``shutdown`` stops them.  The
scheduler and everything above it are the same as with one rank.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import weakref
from concurrent.futures import Future
from typing import Any, AsyncIterator, Callable, Iterator, Optional, TypeVar, Union

from radixserve.config import EngineConfig
from radixserve.embedding import finalize
from radixserve.engine.driver import EngineDriver
from radixserve.lora.registry import lora_summary, registry_for
from radixserve.model.hub import resolve_engine_config
from radixserve.output_state import OutputState
from radixserve.request_builder import Limits, RequestBuilder, split_prompts
from radixserve.sampling_params import SamplingParams
from radixserve.scheduler.build import build_scheduler, new_req
from radixserve.scheduler.cache_persist import CachePersister
from radixserve.scheduler.req import Req
from radixserve.scheduler.scheduler import Scheduler
from radixserve.tokenizer import load_hf_tokenizer
from radixserve.worker.build import build_worker
from radixserve.worker.kv_setup import build_prefix_store, build_tier_store

logger = logging.getLogger(__name__)

Prompt = Union[str, list[str], None]
Params = Union[dict, SamplingParams, list, None]
T = TypeVar("T")
_END = object()


class Engine:
    """In-process generation.  Keyword options are the fields of ModelConfig, CacheConfig
    and SchedulerConfig (see radixserve/config.py)."""

    def __init__(self, model: Optional[str] = None, show_progress: bool = False,
                 config: Optional[EngineConfig] = None, **kwargs: Any) -> None:
        # a Hub id (ORG/NAME[:QUANT]) is fetched here, once: the worker and the ranks get local paths
        self.config = resolve_engine_config(config or EngineConfig.from_kwargs(model, **kwargs), show_progress)
        self._driver = EngineDriver(lambda: self._build(show_progress))
        try:
            self._driver.ready.result()  # the build's error, raised here
        except BaseException:
            self._driver.close(wait=False)
            raise
        self._finalizer = weakref.finalize(self, _stop, self._driver, self.runner, self._tiers)

    def _build(self, show_progress: bool) -> tuple[Scheduler, Any]:
        """The model, its KV pool, the scheduler: on the driver's thread, where every step runs
        (``EngineDriver``: all torch work on one thread)."""
        if self.config.parallel.world_size > 1:
            from radixserve.worker.tp.group_worker import start_group

            self.runner, self.info = start_group(self.config)
        else:
            self.runner, self.info = build_worker(self.config, show_progress)
        self.model_path = self.info.hf_dir
        try:
            self.tokenizer = load_hf_tokenizer(self.config.model.tokenizer_path or self.model_path)
            self.lora = registry_for(self.config.lora, self.info.lora)  # the served LoRA adapters, by name
            self.builder = RequestBuilder(Limits.of(self.info), self.config.scheduler.grammar_backend,
                                          self.lora if self.config.lora.enable_lora else None,
                                          self.config.scheduler.reasoning_parser)
            # stepped by the driver's thread only: touch it only through run_on_driver
            one_rank = self.config.parallel.world_size == 1
            self._tiers = build_tier_store(self.config, self.runner, self.info) if one_rank \
                else None  # the hierarchical cache's host and disk tiers (enable_hierarchical_cache)
            self.scheduler: Scheduler = build_scheduler(self.config, self.runner, self.info, self.tokenizer, self._tiers)
            self._persister: Optional[CachePersister] = None  # warm restart (cache_persist_dir)
            store = build_prefix_store(self.config, self.runner, self.info)
            if store is not None:
                self._persister = CachePersister(self.scheduler.kv, store, self.config.cache,
                                                 self.info.kv_bytes_per_slot)
                self._persister.restore()
        except BaseException:
            _close_runner(self.runner)
            if getattr(self, "_tiers", None) is not None:
                self._tiers.close()
            raise
        return self.scheduler, self.tokenizer

    # ------------------------------------------------------------------ requests
    def make_requests(self, prompt: Prompt = None, sampling_params: Params = None, input_ids: Any = None,
                      return_logprob: bool = False, logprob_start_len: int = -1,
                      top_logprobs_num: int = 0, lora_path: Any = None,
                      segments: Any = None) -> tuple[list[Req], bool]:
        """Validated, clamped, n-expanded scheduler requests and whether the result is a list.
        ``lora_path``: a LoRA adapter's name for every prompt, or one per prompt (None: the base
        model).  ``segments``: the prompt as segments in place of ``prompt`` / ``input_ids``, as
        /generate takes them (documents marked: radixserve/tokenizer.py).  Raises ValueError naming
        the field."""
        p = split_prompts(prompt, input_ids, sampling_params, self.tokenizer.encode, allow_empty=True,
                          lora_path=lora_path, segments=segments, encode_plain=self._encode_plain)
        msgs = self.builder.build(p.ids, p.params, p.names, None, return_logprob, logprob_start_len,
                                  top_logprobs_num, doc_spans=p.spans)
        return [new_req(m) for m in msgs], p.batched or len(msgs) > 1

    def submit(self, prompt: Prompt = None, sampling_params: Params = None, input_ids: Any = None,
               return_logprob: bool = False, logprob_start_len: int = -1, top_logprobs_num: int = 0,
               on_update: Optional[Callable[[OutputState], None]] = None,
               lora_path: Any = None, segments: Any = None) -> tuple[Future, list[str], bool]:
        """Start a request group; returns (future of its result dicts, rids, batched).
        ``on_update`` runs on the thread that steps the scheduler (see ``EngineDriver``)."""
        reqs, batched = self.make_requests(prompt, sampling_params, input_ids, return_logprob, logprob_start_len,
                                           top_logprobs_num, lora_path, segments)
        return self._driver.submit(reqs, on_update), [r.rid for r in reqs], batched

    def generate(self, prompt: Prompt = None, sampling_params: Params = None, input_ids: Any = None,
                 return_logprob: bool = False, logprob_start_len: int = -1, top_logprobs_num: int = 0,
                 lora_path: Any = None, segments: Any = None):
        """Run to completion; returns one result dict, or a list for batched input / n > 1."""
        fut, rids, batched = self.submit(prompt, sampling_params, input_ids, return_logprob, logprob_start_len,
                                         top_logprobs_num, lora_path=lora_path, segments=segments)
        try:
            outs = self._driver.wait(fut)
        finally:  # e.g. KeyboardInterrupt while waiting
            self._abort_unfinished(fut, rids, "aborted by client")
        return outs if batched else outs[0]

    def generate_stream(self, prompt: Prompt = None, sampling_params: Params = None, input_ids: Any = None,
                        return_logprob: bool = False, logprob_start_len: int = -1,
                        top_logprobs_num: int = 0, lora_path: Any = None, segments: Any = None) -> Iterator[dict]:
        """Yield result dicts with the cumulative ``text`` each time a request's visible text
        grows, and once when it finishes; ``index`` tells which request a chunk belongs to.
        The text never shrinks and never shows (the start of) a stop string.  Closing the
        iterator early aborts what is still running."""
        chunks: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        fut, rids, _ = self.submit(prompt, sampling_params, input_ids, return_logprob, logprob_start_len,
                                   top_logprobs_num, on_update=lambda st: chunks.put(_chunk(st)), lora_path=lora_path,
                                   segments=segments)
        fut.add_done_callback(lambda _f: chunks.put(_END))
        try:
            self._driver.check_caller()
            while True:
                if (item := chunks.get()) is _END:
                    break
                yield item
            fut.result()  # raise the group's error, if any
        finally:
            self._abort_unfinished(fut, rids, "stream closed")

    async def async_generate(self, prompt: Prompt = None, sampling_params: Params = None, input_ids: Any = None,
                             return_logprob: bool = False, logprob_start_len: int = -1, top_logprobs_num: int = 0,
                             lora_path: Any = None, segments: Any = None):
        """``generate`` for asyncio callers (does not block the event loop)."""
        fut, rids, batched = self.submit(prompt, sampling_params, input_ids, return_logprob, logprob_start_len,
                                         top_logprobs_num, lora_path=lora_path, segments=segments)
        try:
            outs = await asyncio.wrap_future(fut)
        finally:  # a cancelled task cancels ``fut``
            self._abort_unfinished(fut, rids, "aborted by client")
        return outs if batched else outs[0]

    async def async_generate_stream(self, prompt: Prompt = None, sampling_params: Params = None,
                                    input_ids: Any = None, return_logprob: bool = False, logprob_start_len: int = -1,
                                    top_logprobs_num: int = 0, lora_path: Any = None,
                                    segments: Any = None) -> AsyncIterator[dict]:
        """``generate_stream`` for asyncio callers."""
        loop = asyncio.get_running_loop()
        chunks: asyncio.Queue = asyncio.Queue()

        def put(item: Any) -> None:
            loop.call_soon_threadsafe(chunks.put_nowait, item)

        fut, rids, _ = self.submit(prompt, sampling_params, input_ids, return_logprob, logprob_start_len,
                                   top_logprobs_num, on_update=lambda st: put(_chunk(st)), lora_path=lora_path,
                                   segments=segments)
        fut.add_done_callback(lambda _f: put(_END))
        try:
            while (item := await chunks.get()) is not _END:
                yield item
            fut.result()
        finally:
            self._abort_unfinished(fut, rids, "stream closed")

    def _encode_plain(self, text: str) -> list[int]:
        """``text``'s own ids, without the tokenizer's special tokens (a segment's)."""
        return self.tokenizer.encode(text, add_special_tokens=False)

    def encode(self, prompt: Prompt = None, input_ids: Any = None, pooling: Optional[str] = None,
               normalize: bool = True) -> Union[dict, list[dict]]:
        """Embeddings of the served causal LM: its final hidden state pooled over each prompt
        (``pooling`` "last" or "mean", default ``embedding_pooling`` of the config), L2-normalized
        unless ``normalize`` is False.  Returns ``{"embedding": [float], "meta_info": {...}}`` (a
        list for batched input).  Prefill only; cached prefixes are reused ("last") and the
        prompt's KV stays in the prefix cache.  Raises ValueError naming the field."""
        p = split_prompts(prompt, input_ids, None, self.tokenizer.encode)
        msgs = self.builder.build_embed(p.ids, p.names, pooling or self.config.model.embedding_pooling)
        fut = self._driver.submit([new_req(m) for m in msgs])
        try:
            outs = self._driver.wait(fut)
        finally:
            self._abort_unfinished(fut, [m.rid for m in msgs], "aborted by client")
        res = [{"embedding": finalize(o.get("embedding"), normalize), "meta_info": o["meta_info"]} for o in outs]
        return res if p.batched else res[0]

    def abort(self, rid: str, message: str = "aborted by client") -> None:
        """Abort one running sequence (its group's future still settles, with that finish_reason)."""
        self._driver.abort(rid, message)

    def _abort_unfinished(self, fut: Future, rids: list[str], message: str) -> None:
        if fut.cancelled() or not fut.done():
            for rid in rids:
                self._driver.abort(rid, message)

    # ------------------------------------------------------------------ admin (run between steps)
    def run_on_driver(self, fn: Callable[[Scheduler], T], timeout: Optional[float] = None) -> T:
        """``fn(scheduler)`` on the stepping thread, between steps; returns its result."""
        return self._driver.call(fn).result(timeout)

    def flush_cache(self) -> bool:
        return self.run_on_driver(lambda s: s.flush_cache())

    def load_lora_adapter(self, lora_name: str, lora_path: str) -> dict:
        """Serve another LoRA adapter (a PEFT directory) as ``lora_name``, while running; its
        summary.  ValueError naming the field when it cannot be served."""
        self.lora.check(lora_name, lora_path)
        info = self.run_on_driver(lambda s: s.lora.load(lora_name, lora_path))
        self.lora.add(info)
        return lora_summary(info)

    def unload_lora_adapter(self, lora_name: str) -> dict:
        """Stop serving ``lora_name``: new requests naming it are refused at once, its weights go
        when the requests using it are done."""
        info = self.lora.remove(lora_name)
        busy = self.run_on_driver(lambda s: s.lora.unload(info.uid, s.lora_users))
        return {"lora_name": lora_name, "requests_in_flight": busy}

    def lora_adapters(self) -> list[dict]:
        return [lora_summary(a) for a in self.lora.adapters.values()]

    def stats(self) -> dict:
        return self.run_on_driver(lambda s: s.stats())

    def check_invariants(self) -> None:
        self.run_on_driver(lambda s: s.check_invariants())

    def persist_cache(self) -> bool:
        """Write the hottest cached prefixes to ``cache_persist_dir`` now (waits for the file);
        False when not configured or the write failed."""
        persister = self._persister
        return persister is not None and self.run_on_driver(lambda s: persister.save(wait=True)).ok

    def shutdown(self) -> None:
        """Persist the prefix cache (with ``cache_persist_dir``), then stop the driver (and a
        tensor-parallel group's processes); running requests' futures fail.  Idempotent."""
        if self._persister is not None and self._finalizer.alive:
            try:
                self.persist_cache()
            except Exception:  # e.g. the driver died: stopping must still work
                logger.exception("could not persist the prefix cache")
        self._persister = None
        self._finalizer()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


def _close_runner(runner: Any) -> None:
    close = getattr(runner, "close", None)  # a GroupWorker's ranks; a ModelRunner has nothing to stop
    if close is not None:
        close()


def _stop(driver: EngineDriver, runner: Any, tiers: Any = None) -> None:
    driver.close()
    _close_runner(runner)
    if tiers is not None:
        tiers.close()


def _chunk(state: OutputState) -> dict:
    return {**state.to_native(), "index": state.index}
