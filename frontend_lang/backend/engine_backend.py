"""In-process backends over ``radixserve.Engine`` (no server, no HTTP).

    backend = Runtime("path/or/hf-id", dtype="float32")        # builds an Engine
    backend = EngineBackend(existing_engine)                    # wraps one you built

A thin client of the Engine's public, thread-safe API (``generate`` / ``generate_stream``):
fork branches and run_batch programs run concurrently as on a server.  Results, meta_info
and error messages have the shape of the server's /generate (the Engine shares the server's
request builder and output path); invalid parameters raise ``BackendError(message, 400)``.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Optional

from frontend_lang.backend.base import Backend, TokenLogprob, finish_error, lora_kw, segments_of, with_priority
from frontend_lang.chat_template import ChatTemplate
from frontend_lang.errors import BackendError


class EngineBackend(Backend):
    def __init__(self, engine: Any, owns_engine: bool = False) -> None:
        self.engine = engine
        self.owns_engine = owns_engine
        self._lock = threading.Lock()
        self._template: Optional[ChatTemplate] = None

    def _run(self, prompt: Any, sampling_params: Any, input_ids: Any = None, return_logprob: bool = False,
             logprob_start_len: int = -1, top_logprobs_num: int = 0,
             on_text: Optional[Callable[[int, str], None]] = None,
             lora_path: Optional[str] = None, segments: Optional[list[dict[str, Any]]] = None) -> list[dict[str, Any]]:
        args = (prompt, sampling_params, input_ids, return_logprob, logprob_start_len, top_logprobs_num)
        kw = {**lora_kw(lora_path), **({} if segments is None else {"segments": segments})}
        try:
            if on_text is None:
                outs = self.engine.generate(*args, **kw)
                outs = outs if isinstance(outs, list) else [outs]
            else:
                finals: dict[int, dict[str, Any]] = {}
                for chunk in self.engine.generate_stream(*args, **kw):
                    if chunk["meta_info"]["finish_reason"] is None:
                        on_text(chunk["index"], chunk["text"])
                    else:
                        finals[chunk["index"]] = chunk
                outs = [finals[i] for i in sorted(finals)]
        except (ValueError, TypeError, OverflowError) as e:
            raise BackendError(str(e), 503 if isinstance(e, OverflowError) else 400) from None
        except Exception as e:
            raise BackendError(f"engine error: {type(e).__name__}: {e}", 500) from e
        for o in outs:
            aborted = finish_error(o["meta_info"])
            if aborted is not None:
                raise BackendError(aborted)
        return outs

    def generate(self, text: str, sampling_params: dict[str, Any], options: dict[str, Any],
                 on_text: Optional[Callable[[str], None]] = None,
                 documents: Optional[list[tuple[int, int]]] = None) -> tuple[str, dict[str, Any]]:
        opts = dict(options)
        with_text = opts.pop("return_text_in_logprobs", False)
        callback = None if on_text is None else (lambda _i, t: on_text(t))
        segments = segments_of(text, documents) if documents else None
        out = self._run(None if segments else text, dict(sampling_params),
                        return_logprob=bool(opts.get("return_logprob", False)),
                        logprob_start_len=opts.get("logprob_start_len", -1),
                        top_logprobs_num=opts.get("top_logprobs_num", 0), on_text=callback,
                        lora_path=opts.get("lora_path"), segments=segments)[0]
        meta = out["meta_info"]
        if with_text and "input_token_logprobs" in meta:
            self._add_token_text(meta)
        return out["text"], meta

    def _add_token_text(self, meta: dict[str, Any]) -> None:
        def fill(entries: list) -> list:
            return [[e[0], e[1], self.engine.tokenizer.decode([e[1]])] for e in entries]

        for key in ("input_token_logprobs", "output_token_logprobs"):
            meta[key] = fill(meta[key])

    def cache_prefix(self, text: Optional[str] = None, input_ids: Optional[list[int]] = None,
                     priority: Optional[int] = None, lora_path: Optional[str] = None) -> None:
        self._run(text, with_priority({"max_new_tokens": 0}, priority), input_ids=input_ids, lora_path=lora_path)

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        return [list(self.engine.tokenizer.encode(t)) for t in texts]

    def prompt_logprobs(self, input_ids: list[list[int]], logprob_start_len: int,
                        priority: Optional[int] = None, lora_path: Optional[str] = None) -> list[list[TokenLogprob]]:
        outs = self._run(None, with_priority({"max_new_tokens": 0}, priority), input_ids=[list(i) for i in input_ids],
                         return_logprob=True, logprob_start_len=logprob_start_len, lora_path=lora_path)
        return [[(e[0], e[1]) for e in o["meta_info"]["input_token_logprobs"]] for o in outs]

    def chat_template(self) -> ChatTemplate:
        with self._lock:
            if self._template is None:
                from radixserve.tokenizer import load_hf_tokenizer

                cfg = self.engine.config.model
                tok = load_hf_tokenizer(cfg.tokenizer_path or self.engine.model_path)
                self._template = ChatTemplate(getattr(tok, "chat_template", None), dict(tok.special_tokens_map))
            return self._template

    def shutdown(self) -> None:
        if self.owns_engine:
            self.engine.shutdown()


class Runtime(EngineBackend):
    """An ``EngineBackend`` that builds its own Engine: ``Runtime(model_path, **engine_options)``
    takes the arguments of ``radixserve.Engine`` (dtype, max_total_tokens, ...)."""

    def __init__(self, model_path: Optional[str] = None, **engine_options: Any) -> None:
        from radixserve.engine import Engine

        super().__init__(Engine(model_path, **engine_options), owns_engine=True)
