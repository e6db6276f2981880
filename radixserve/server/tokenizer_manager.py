"""TokenizerManager: the server process's asyncio side of the runtime.

It tokenizes and validates requests (400s name the field), expands batches and n > 1 into
single sequences, sends them to the scheduler, and routes the detokenizer's outputs back
to the waiting handler.  Contract of ``events``: it yields a ReqState each time that
state changed, raises ``RequestError`` if one of the group failed, and on every exit path
(finish, error, client gone, cancellation) aborts what is still running.  With ``accounting``
set, ``submit`` admits the group against its API key (429 before anything is sent) and each
sequence is charged when it is done (``_done``: finished, failed or aborted).
"""
from __future__ import annotations

import asyncio
import logging
import pickle
import time
import uuid
from typing import Any, AsyncIterator, Awaitable, Callable, Optional

import zmq
import zmq.asyncio

from radixserve.config import DEFAULT_GRAMMAR_BACKEND
from radixserve.ipc.server_link import (AbortReq, BatchReqOutput, ControlReply, ControlReq, ReqError,
                                        SchedulerStats, TokenizedRequest)
from radixserve.ipc.worker_link import WorkerInfo
from radixserve.ipc.zmq_utils import IPCAddrs, make_socket, send_obj
from radixserve.lora_config import LoRAConfig
from radixserve.metrics import Metrics
from radixserve.request_builder import Limits, RequestBuilder
from radixserve.server.tenancy.accounting import Accounting
from radixserve.server.openai.chat_encoder import ChatEncoder
from radixserve.server.req_state import ReqState, RequestError

logger = logging.getLogger(__name__)


class TokenizerManager:
    def __init__(self, tokenizer: Any, info: WorkerInfo, addrs: IPCAddrs, tokenizer_path: str = "",
                 grammar_backend: str = DEFAULT_GRAMMAR_BACKEND, lora: Optional[LoRAConfig] = None,
                 reasoning_parser: str = "none") -> None:
        """``lora``: the server's LoRA configuration (None or disabled: no adapters, ``self.lora`` None);
        ``reasoning_parser``: the scheduler's (``SchedulerConfig.reasoning_parser``)."""
        self.tokenizer = tokenizer
        self.chat = ChatEncoder(tokenizer, tokenizer_path)
        self.info = info
        self.lora: Any = None  # the served adapters by name (lora.registry.LoRARegistry); server/lora_routes.py
        if lora is not None and lora.enable_lora:
            from radixserve.lora.registry import registry_for  # only on a server with LoRA

            self.lora = registry_for(lora, info.lora)
        self.builder = RequestBuilder(Limits.of(info), grammar_backend, self.lora, reasoning_parser)
        self.to_sched = make_socket(zmq.Context.instance(), zmq.PUSH, addrs.server_to_sched, bind=False)
        self.from_detok = make_socket(zmq.asyncio.Context.instance(), zmq.PULL, addrs.detok_to_server, bind=True)
        self.states: dict[str, ReqState] = {}
        self.waiters: dict[str, asyncio.Future] = {}
        self.metrics = Metrics()
        self.last_stats: Optional[SchedulerStats] = None
        self.healthy = True
        self.dead_reason: Optional[str] = None
        self._token_texts: dict[int, str] = {}
        self.accounting: Optional[Accounting] = None  # per-key budgets and usage (server/tenancy/accounting.py)

    # ------------------------------------------------------------------ input
    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def encode_plain(self, text: str) -> list[int]:
        """``text``'s own ids, without the tokenizer's special tokens (a segment's: radixserve/tokenizer.py)."""
        return self.tokenizer.encode(text, add_special_tokens=False)

    async def chat_template_info(self) -> dict[str, Any]:
        """The chat template and special-token strings, as transformers loads them, for clients
        that render chat roles themselves (e.g. frontend_lang); None values if unavailable."""
        self.chat.preload()
        try:
            tok = await asyncio.shield(self.chat._hf)
        except Exception as e:
            logger.warning("no chat template: %s", e)
            return {"chat_template": None, "special_tokens_map": {}}
        template = getattr(tok, "chat_template", None)
        return {"chat_template": template if isinstance(template, str) else None,
                "special_tokens_map": dict(getattr(tok, "special_tokens_map", {}) or {})}

    def token_text(self, tid: int) -> str:
        text = self._token_texts.get(tid)
        if text is None:
            text = self._token_texts[tid] = self.tokenizer.decode([tid])
        return text

    def check_prompt(self, ids: list[int], name: str) -> None:
        """RequestError(400) naming ``name`` unless ``ids`` is a usable prompt (``RequestBuilder``)."""
        try:
            self.builder.check_prompt(ids, name)
        except ValueError as e:
            raise RequestError(400, str(e)) from None

    def build(self, prompts: list[list[int]], params: list[dict], names: list[str], rids: Optional[list[str]],
              return_logprob: bool = False, logprob_start_len: int = -1,
              top_logprobs_num: int = 0, doc_spans: Optional[list] = None) -> list[TokenizedRequest]:
        """Validate, clamp and expand prompts (each with its sampling-param dict) into sequences
        through the shared ``RequestBuilder``; copy j of an n > 1 prompt gets seed + j; ``doc_spans``:
        each prompt's document spans (None: no documents).  Raises RequestError(400) naming the field."""
        try:
            return self.builder.build(prompts, params, names, rids, return_logprob, logprob_start_len,
                                      top_logprobs_num, in_use=self.states.__contains__, doc_spans=doc_spans)
        except (ValueError, TypeError) as e:
            raise RequestError(400, str(e)) from None

    # ------------------------------------------------------------------ lifecycle of a group
    def submit(self, reqs: list[TokenizedRequest]) -> list[ReqState]:
        if not self.healthy:
            raise RequestError(503, f"server unhealthy: {self.dead_reason}")
        if self.accounting is not None:
            self.accounting.admit(reqs)  # may raise 429: then nothing is sent or charged
        group: asyncio.Queue = asyncio.Queue()
        states = []
        for i, r in enumerate(reqs):
            st = ReqState(r.rid, i, r.input_ids, r.return_logprob, r.logprob_start_len, r.top_logprobs_num,
                          group=group)
            self.states[r.rid] = st
            states.append(st)
            send_obj(self.to_sched, r)
        return states

    async def events(self, states: list[ReqState],
                     disconnected: Optional[Callable[[], Awaitable[bool]]] = None) -> AsyncIterator[ReqState]:
        group = states[0].group
        remaining = {st.rid for st in states}
        last_check = time.monotonic()
        try:
            while remaining:
                try:
                    st = await asyncio.wait_for(group.get(), timeout=0.5)
                except asyncio.TimeoutError:
                    st = None
                # check the client every 0.5 s, also while tokens keep arriving
                if disconnected is not None and time.monotonic() - last_check >= 0.5:
                    last_check = time.monotonic()
                    if await disconnected():
                        logger.info("client disconnected; aborting %d request(s)", len(remaining))
                        return
                if st is None:
                    continue
                st.dirty = False
                if st.error is not None:
                    raise st.error
                if st.done:
                    remaining.discard(st.rid)
                yield st
        finally:
            for st in states:
                if st.done:
                    self.states.pop(st.rid, None)
                elif not st.detached:
                    st.detached = True
                    self.abort(st.rid)

    async def run_to_end(self, states: list[ReqState],
                         disconnected: Optional[Callable[[], Awaitable[bool]]] = None) -> bool:
        """Wait until every state finished; False when the client went away first."""
        async for _ in self.events(states, disconnected):
            pass
        return all(st.done for st in states)

    def abort(self, rid: str, message: str = "aborted by client") -> None:
        send_obj(self.to_sched, AbortReq(rid, message))

    def abort_matching(self, rid: str) -> int:
        """Abort ``rid`` and its n > 1 copies (``rid-0``, ``rid-1``, ...); "" aborts all."""
        hits = [r for r in self.states if not rid or r == rid or r.startswith(rid + "-")]
        for r in hits:
            self.abort(r)
        return len(hits)

    async def control(self, kind: str, timeout: float = 30.0, args: Optional[dict[str, Any]] = None) -> Any:
        """The scheduler's reply to control request ``kind`` (``ControlReq``)."""
        req_id = uuid.uuid4().hex
        fut = asyncio.get_running_loop().create_future()
        self.waiters[req_id] = fut
        send_obj(self.to_sched, ControlReq(req_id, kind, dict(args or {})))
        try:
            return await asyncio.wait_for(fut, timeout)
        finally:
            self.waiters.pop(req_id, None)

    def fail_all(self, reason: str) -> None:
        """A child process died: fail every request and every health check from now on."""
        self.healthy, self.dead_reason = False, reason
        for st in list(self.states.values()):
            st.fail(RequestError(500, f"server error: {reason}"))
            self._done(st)
        for fut in self.waiters.values():
            if not fut.done():
                fut.set_exception(RequestError(503, f"server unhealthy: {reason}"))

    # ------------------------------------------------------------------ output
    async def recv_loop(self) -> None:
        while True:
            msg = pickle.loads(await self.from_detok.recv())
            try:
                self.dispatch(msg)
            except Exception:
                logger.exception("dispatching %s failed", type(msg).__name__)

    def dispatch(self, msg: Any) -> None:
        if isinstance(msg, BatchReqOutput):
            now = time.perf_counter()
            for out in msg.outputs:
                st = self.states.get(out.rid)
                if st is None:
                    continue
                self._observe(st, out, now)
                st.apply(out, now)
                if st.done:
                    self._done(st)
                    if st.detached:
                        self.states.pop(st.rid, None)
        elif isinstance(msg, ReqError):
            st = self.states.pop(msg.rid, None)
            if st is not None:
                headers = {"Retry-After": "1"} if msg.status == 503 else None
                st.fail(RequestError(msg.status, msg.message, headers))
                self._done(st)
        elif isinstance(msg, ControlReply):
            fut = self.waiters.get(msg.req_id)
            if fut is not None and not fut.done():
                fut.set_result(msg.payload)
        elif isinstance(msg, SchedulerStats):
            self.last_stats = msg
            self.metrics.observe_stats(msg)

    def _done(self, st: ReqState) -> None:
        """``st`` finished or failed: charge it (durable before its handler resumes)."""
        if self.accounting is not None:
            try:
                self.accounting.settle(st)
            except Exception:
                logger.exception("charging %s failed", st.rid)

    def _observe(self, st: ReqState, out: Any, now: float) -> None:
        m = self.metrics
        if out.queue_time is not None:
            m.queue.observe(out.queue_time)
        if out.new_ids:
            if st.first_token_time is None:
                m.ttft.observe(now - st.created)
            elif st.last_token_time is not None:
                m.itl.observe((now - st.last_token_time) / len(out.new_ids))
        if out.finish_reason is not None:
            m.observe_finish(out.finish_reason.get("type", "unknown"), len(st.input_ids), out.completion_tokens,
                             out.cached_tokens, now - st.created, out.spec_proposed, out.spec_accepted)
