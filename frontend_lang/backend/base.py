"""The interface every backend implements; programs only talk to a backend through it.

All methods are thread-safe and may run concurrently (fork branches and run_batch programs
call them from their own executor threads).  Every failure raises ``BackendError`` with the
server's message; no call blocks forever (HTTP calls have timeouts, the in-process driver
always settles its requests).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable, Optional

from frontend_lang.chat_template import ChatTemplate

TokenLogprob = tuple[Optional[float], int]  # (logprob or None for position 0, token id)


class Backend(ABC):
    @abstractmethod
    def generate(self, text: str, sampling_params: dict[str, Any], options: dict[str, Any],
                 on_text: Optional[Callable[[str], None]] = None,
                 documents: Optional[list[tuple[int, int]]] = None) -> tuple[str, dict[str, Any]]:
        """Generate a continuation of ``text``; returns (output text, meta_info) as /generate
        does.  ``options`` holds request-level fields (return_logprob, logprob_start_len,
        top_logprobs_num, return_text_in_logprobs, and lora_path: the LoRA adapter's name).
        With ``on_text`` the call streams and calls it with the cumulative output text as it grows.
        ``documents``: the character ranges of ``text`` that are documents (``segments_of``); only
        passed when there are some."""

    @abstractmethod
    def cache_prefix(self, text: Optional[str] = None, input_ids: Optional[list[int]] = None,
                     priority: Optional[int] = None, lora_path: Optional[str] = None) -> None:
        """Prefill ``text`` (or ``input_ids``) with max_new_tokens 0 so later requests that start
        with it hit the prefix cache (a prefix hint); ``priority`` None is the server's default;
        ``lora_path`` the LoRA adapter whose cache it fills (None: the base model's).  Callers
        pass ``lora_path`` only when set (``lora_kw``), so a backend without LoRA may omit it."""

    @abstractmethod
    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, exactly as a /generate ``text`` prompt is tokenized."""

    @abstractmethod
    def prompt_logprobs(self, input_ids: list[list[int]], logprob_start_len: int,
                        priority: Optional[int] = None, lora_path: Optional[str] = None) -> list[list[TokenLogprob]]:
        """For each prompt, (logprob, token id) of every position from ``logprob_start_len`` on
        (logprob None at position 0), from one batched prefill that generates nothing, at
        ``priority`` (None: the server's default), under LoRA adapter ``lora_path`` (as in
        ``cache_prefix``)."""

    @abstractmethod
    def chat_template(self) -> ChatTemplate:
        """The model's chat template (fetched once, then cached)."""

    def flush_cache(self) -> bool:
        """Empty the prefix cache; True when it was flushed (False: requests were running)."""
        raise NotImplementedError(f"{type(self).__name__}: flush_cache is not supported")

    def get_server_info(self) -> dict[str, Any]:
        """The server's configuration and statistics (/get_server_info)."""
        raise NotImplementedError(f"{type(self).__name__}: get_server_info is not supported")

    def shutdown(self) -> None:
        """Release connections / threads; the backend is unusable afterwards."""


def segments_of(text: str, documents: list[tuple[int, int]]) -> list[dict[str, Any]]:
    """``text`` as /generate ``segments``: the sorted character ranges ``documents`` marked
    ``"document": true``, the text around them plain (empty pieces left out)."""
    out: list[dict[str, Any]] = []
    at = 0
    for start, end in documents:
        if start > at:
            out.append({"text": text[at:start]})
        out.append({"text": text[start:end], "document": True})
        at = end
    if at < len(text):
        out.append({"text": text[at:]})
    return out


def with_priority(sampling_params: dict[str, Any], priority: Optional[int]) -> dict[str, Any]:
    """``sampling_params`` plus ``priority`` when one is given."""
    return sampling_params if priority is None else {**sampling_params, "priority": priority}


def lora_kw(lora_path: Optional[str]) -> dict[str, Any]:
    """``{"lora_path": lora_path}`` when an adapter is named, else nothing."""
    return {} if lora_path is None else {"lora_path": lora_path}


def finish_error(meta: dict[str, Any]) -> Optional[str]:
    """The message of an aborted request's finish_reason, None when it finished normally."""
    reason = meta.get("finish_reason") or {}
    if isinstance(reason, dict) and reason.get("type") == "abort":
        return str(reason.get("message") or "request aborted")
    return None
