"""The client-side state of one sequence and its native (SGLang) response dict.

One builder of ``{text, output_ids, meta_info}`` for the server and the in-process Engine:
``OutputState.apply`` folds one ``ReqOutput`` delta (token ids from the scheduler, text from
the detokenizer's ``DetokState``) into the cumulative state; ``to_native`` renders it.  The
``meta_info`` shape is SGLang's: logprob entries are ``[logprob, token_id, token_text]`` lists
(``token_text`` None unless a ``token_text`` function is given), an unscored first prompt
position is ``[None, token_id, text]``, and ``e2e_latency`` appears once finished.
``document_reused_tokens`` / ``document_recomputed_tokens`` count the prompt's document tokens
whose KV was reused out of order and recomputed (0 without documents); ``document_fallback``
(only when set) says why the documents ran as exact prefill instead.
Not thread-safe: one owner (the server's event loop, or the Engine's driver thread).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from radixserve.ipc.server_link import ReqOutput
from radixserve.ipc.worker_link import TokenLogprob

TokenText = Optional[Callable[[int], str]]


@dataclass
class OutputState:
    rid: str
    index: int
    input_ids: list[int]
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: Optional[dict] = None
    cached_tokens: int = 0
    document_reused: int = 0
    document_recomputed: int = 0
    document_fallback: Optional[str] = None
    queue_time: Optional[float] = None
    spec_proposed: int = 0
    spec_accepted: int = 0
    output_logprobs: list[TokenLogprob] = field(default_factory=list)
    input_logprobs: list[Optional[TokenLogprob]] = field(default_factory=list)
    created: float = field(default_factory=time.perf_counter)
    first_token_time: Optional[float] = None
    last_token_time: Optional[float] = None
    embedding: Any = None  # float32 numpy, pooled (not normalized): embedding requests, once finished

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def apply(self, out: ReqOutput, now: float) -> None:
        """Fold one delta in (``out.text`` filled by the detokenizer), then ``notify``."""
        if out.new_ids:
            if self.first_token_time is None:
                self.first_token_time = now
            self.last_token_time = now
        self.output_ids.extend(out.new_ids)
        self.text = out.final_text if out.final_text is not None else self.text + out.text
        self.cached_tokens = out.cached_tokens
        self.document_reused, self.document_recomputed = out.document_reused_tokens, out.document_recomputed_tokens
        self.document_fallback = out.document_fallback
        self.spec_proposed, self.spec_accepted = out.spec_proposed, out.spec_accepted
        if out.queue_time is not None:
            self.queue_time = out.queue_time
        self.output_logprobs.extend(out.new_output_logprobs)
        if out.input_logprobs is not None:
            self.input_logprobs = out.input_logprobs
        if out.embedding is not None:
            self.embedding = out.embedding
        if out.finish_reason is not None:
            self.finish_reason = out.finish_reason
        self.notify()

    def notify(self) -> None:
        """Hook for subclasses: called after every ``apply``."""

    # ------------------------------------------------------------------ native output
    def meta_info(self, token_text: TokenText = None) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "id": self.rid, "finish_reason": self.finish_reason, "prompt_tokens": len(self.input_ids),
            "completion_tokens": len(self.output_ids), "cached_tokens": self.cached_tokens,
            "spec_proposed_tokens": self.spec_proposed, "spec_accepted_tokens": self.spec_accepted,
            "document_reused_tokens": self.document_reused, "document_recomputed_tokens": self.document_recomputed,
        }
        if self.document_fallback is not None:
            meta["document_fallback"] = self.document_fallback
        if self.spec_proposed:
            meta["spec_acceptance_rate"] = self.spec_accepted / self.spec_proposed
        if self.finish_reason is not None:
            meta["e2e_latency"] = time.perf_counter() - self.created
        if not self.return_logprob:
            return meta

        def entry(lp: Optional[float], tid: int) -> list:
            return [lp, tid, token_text(tid) if token_text else None]

        start = max(self.logprob_start_len, 0)
        inputs = []
        for i, t in enumerate(self.input_logprobs):
            inputs.append(entry(None, self.input_ids[min(start + i, len(self.input_ids) - 1)]) if t is None
                          else entry(t.logprob, t.token_id))
        meta["input_token_logprobs"] = inputs
        meta["output_token_logprobs"] = [entry(t.logprob, t.token_id) for t in self.output_logprobs]
        if self.top_logprobs_num:
            def tops(t: Optional[TokenLogprob]) -> Optional[list]:
                return None if t is None or t.top is None else [entry(lp, i) for lp, i in t.top]

            meta["input_top_logprobs"] = [tops(t) for t in self.input_logprobs]
            meta["output_top_logprobs"] = [tops(t) for t in self.output_logprobs]
        return meta

    def to_native(self, token_text: TokenText = None) -> dict[str, Any]:
        """``{text, output_ids, meta_info}``, plus ``embedding`` (the raw pooled numpy vector)
        for an embedding request."""
        out = {"text": self.text, "output_ids": list(self.output_ids), "meta_info": self.meta_info(token_text)}
        if self.embedding is not None:
            out["embedding"] = self.embedding
        return out
