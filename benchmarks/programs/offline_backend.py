"""A ``frontend_lang`` backend over vLLM's offline ``LLM`` API (its best case for programs).

The engine runs in vLLM's own Python (``peer_runners/vllm_programs.py``); this side gathers
the calls of all concurrently running programs into batches: the first pending call opens a
batch, which closes when no new call has come for ``window_s`` (or it holds ``max_batch``), and
goes to ONE ``LLM.generate``.  Calls that arrive while a batch runs form the next one.  That is
what a user of the offline API does by hand (step every program, then generate for all), with
no batching lost to the interpreter.  ``select`` asks prompt logprobs (``prompt_logprobs=0``),
as lm-eval-harness does with vLLM; the prefix hint is a 1-token generation on the prefix.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from multiprocessing.connection import Client
from typing import Any, Callable, Optional

from frontend_lang.backend.base import Backend, TokenLogprob
from frontend_lang.chat_template import ChatTemplate
from frontend_lang.errors import BackendError


class OfflineBatchBackend(Backend):
    def __init__(self, port: int, authkey: bytes, tokenizer: Any, template: ChatTemplate,
                 window_s: float = 0.003, max_batch: int = 256) -> None:
        self.conn = Client(("127.0.0.1", port), authkey=authkey)
        self.tok = tokenizer
        self.template = template
        self.window_s = window_s
        self.max_batch = max_batch
        self._cond = threading.Condition()
        self._pending: list[tuple[dict[str, Any], Future]] = []
        self._last_arrival = 0.0
        self._closed = False
        self._conn_lock = threading.Lock()
        self._tok_lock = threading.Lock()
        self._thread = threading.Thread(target=self._dispatch, name="offline-batcher", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ batching
    def _submit(self, req: dict[str, Any]) -> dict[str, Any]:
        fut: Future = Future()
        with self._cond:
            if self._closed:
                raise BackendError("vLLM offline backend is shut down")
            self._pending.append((req, fut))
            self._last_arrival = time.perf_counter()
            self._cond.notify_all()
        return fut.result()

    def _take_batch(self) -> Optional[list[tuple[dict[str, Any], Future]]]:
        with self._cond:
            while not self._pending and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            while len(self._pending) < self.max_batch:
                quiet = time.perf_counter() - self._last_arrival
                if quiet >= self.window_s:
                    break
                self._cond.wait(self.window_s - quiet)
            batch, self._pending = self._pending[:self.max_batch], self._pending[self.max_batch:]
            return batch

    def _dispatch(self) -> None:
        while True:
            batch = self._take_batch()
            if batch is None:
                return
            try:
                answer = self._call(("batch", [r for r, _ in batch]))
            except Exception as e:  # the peer died: every caller gets the error
                answer = {"error": f"vLLM offline peer: {type(e).__name__}: {e}"}
            for i, (_, fut) in enumerate(batch):
                if isinstance(answer, dict):
                    fut.set_exception(BackendError(answer["error"]))
                else:
                    fut.set_result(answer[i])

    def _call(self, msg: tuple) -> Any:
        with self._conn_lock:
            self.conn.send(msg)
            return self.conn.recv()

    # ------------------------------------------------------------------ Backend
    def generate(self, text: str, sampling_params: dict[str, Any], options: dict[str, Any],
                 on_text: Optional[Callable[[str], None]] = None) -> tuple[str, dict[str, Any]]:
        if options.get("return_logprob") or options.get("lora_path"):
            raise BackendError("vLLM offline: logprobs or LoRA in gen are not used by the suite", 501)
        p = dict(sampling_params)
        params: dict[str, Any] = {"temperature": p.pop("temperature", 1.0), "max_tokens": p.pop("max_new_tokens", 128)}
        for name in ("top_p", "top_k", "stop", "seed", "ignore_eos", "regex"):
            if p.get(name) is not None:
                params[name] = p.pop(name)
        if p.get("json_schema") is not None:
            params["json"] = p.pop("json_schema")
        p.pop("priority", None)
        if any(v is not None for v in p.values()):
            raise BackendError(f"vLLM offline: sampling parameter(s) {sorted(p)} not mapped", 501)
        out = self._submit({"kind": "gen", "prompt": text, "params": params})
        if on_text is not None:
            on_text(out["text"])
        return out["text"], {k: out[k] for k in ("finish_reason", "prompt_tokens", "completion_tokens",
                                                 "cached_tokens")}

    def cache_prefix(self, text: Optional[str] = None, input_ids: Optional[list[int]] = None,
                     priority: Optional[int] = None, lora_path: Optional[str] = None) -> None:
        prompt: Any = text if input_ids is None else list(input_ids)
        self._submit({"kind": "gen", "prompt": prompt, "params": {"temperature": 0.0, "max_tokens": 1}})

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        with self._tok_lock:
            return [self.tok.encode(t) for t in texts]

    def prompt_logprobs(self, input_ids: list[list[int]], logprob_start_len: int,
                        priority: Optional[int] = None, lora_path: Optional[str] = None) -> list[list[TokenLogprob]]:
        futs = []
        for ids in input_ids:  # one request per choice, all in the same batch
            fut: Future = Future()
            with self._cond:
                self._pending.append(({"kind": "logprobs", "prompt": list(ids), "params": {}}, fut))
                self._last_arrival = time.perf_counter()
                self._cond.notify_all()
            futs.append(fut)
        rows = []
        for ids, fut in zip(input_ids, futs):
            lps = fut.result()["prompt_logprobs"]
            rows.append(list(zip(lps, ids))[logprob_start_len:])
        return rows

    def chat_template(self) -> ChatTemplate:
        return self.template

    def stats(self) -> dict[str, Any]:
        return self._call(("stats",))

    def reset_cache(self) -> bool:
        return bool(self._call(("reset",)))

    def shutdown(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        try:
            self._call(("quit",))
        except (OSError, EOFError):
            pass
        self.conn.close()
