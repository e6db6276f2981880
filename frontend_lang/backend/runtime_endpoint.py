"""``RuntimeEndpoint``: a backend that talks to a running radixserve (or SGLang-style) server.

    backend = RuntimeEndpoint("http://127.0.0.1:30000", api_key="sk-...")

It uses POST /generate (SGLang's body, SSE when streaming; a LoRA adapter as its top-level
``lora_path``; a prompt with documents as ``segments``), POST /tokenize and
GET /get_model_info (for the chat template).  Nothing is sent at construction; the first
call that needs the server contacts it.  Every request has a timeout (``connect_timeout``
to connect, ``timeout`` for the whole response); a server that cannot be reached, an HTTP
error or an ``error`` chunk in a stream raises ``BackendError`` with the server's message.
"""
from __future__ import annotations

import json
import threading
from typing import Any, Callable, Optional

import httpx

from frontend_lang.backend.base import Backend, TokenLogprob, finish_error, lora_kw, segments_of, with_priority
from frontend_lang.chat_template import ChatTemplate
from frontend_lang.errors import BackendError


def _error_message(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text.strip() or resp.reason_phrase
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict) and err.get("message"):
        return str(err["message"])
    if isinstance(err, str):
        return err
    return json.dumps(body)


class RuntimeEndpoint(Backend):
    def __init__(self, base_url: str, api_key: Optional[str] = None, timeout: float = 600.0,
                 connect_timeout: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(base_url=self.base_url, headers=headers,
                                    timeout=httpx.Timeout(timeout, connect=connect_timeout),
                                    limits=httpx.Limits(max_connections=512, max_keepalive_connections=128))
        self._lock = threading.Lock()
        self._template: Optional[ChatTemplate] = None
        self._model_info: Optional[dict[str, Any]] = None

    # ------------------------------------------------------------------ HTTP
    def _request(self, method: str, path: str, body: Optional[dict] = None) -> Any:
        try:
            resp = self._client.request(method, path, json=body)
        except httpx.HTTPError as e:
            raise BackendError(f"{self.base_url}{path}: cannot reach the server ({type(e).__name__}: {e})") from None
        if resp.status_code >= 400:
            raise BackendError(_error_message(resp), resp.status_code)
        return resp.json()

    def _stream(self, body: dict, on_text: Callable[[str], None]) -> dict:
        last: Optional[dict] = None
        try:
            with self._client.stream("POST", "/generate", json=body) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    raise BackendError(_error_message(resp), resp.status_code)
                for line in resp.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    if "error" in chunk:
                        err = chunk["error"]
                        raise BackendError(err.get("message", str(err)) if isinstance(err, dict) else str(err),
                                           err.get("code") if isinstance(err, dict) else None)
                    last = chunk
                    on_text(chunk.get("text", ""))
        except httpx.HTTPError as e:
            raise BackendError(f"{self.base_url}/generate: stream failed ({type(e).__name__}: {e})") from None
        if last is None:
            raise BackendError(f"{self.base_url}/generate: the stream ended without output")
        return last

    # ------------------------------------------------------------------ Backend
    def generate(self, text: str, sampling_params: dict[str, Any], options: dict[str, Any],
                 on_text: Optional[Callable[[str], None]] = None,
                 documents: Optional[list[tuple[int, int]]] = None) -> tuple[str, dict[str, Any]]:
        prompt = {"segments": segments_of(text, documents)} if documents else {"text": text}
        body = {**prompt, "sampling_params": sampling_params, **options}
        if on_text is not None:
            out = self._stream({**body, "stream": True}, on_text)
        else:
            out = self._request("POST", "/generate", body)
        meta = out.get("meta_info", {})
        aborted = finish_error(meta)
        if aborted is not None:
            raise BackendError(aborted)
        return out.get("text", ""), meta

    def cache_prefix(self, text: Optional[str] = None, input_ids: Optional[list[int]] = None,
                     priority: Optional[int] = None, lora_path: Optional[str] = None) -> None:
        prompt = {"text": text} if input_ids is None else {"input_ids": input_ids}
        params = with_priority({"max_new_tokens": 0}, priority)
        self._request("POST", "/generate", {**prompt, "sampling_params": params, **lora_kw(lora_path)})

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        return self._request("POST", "/tokenize", {"text": list(texts)})["input_ids"]

    def prompt_logprobs(self, input_ids: list[list[int]], logprob_start_len: int,
                        priority: Optional[int] = None, lora_path: Optional[str] = None) -> list[list[TokenLogprob]]:
        outs = self._request("POST", "/generate", {
            "input_ids": [list(ids) for ids in input_ids],
            "sampling_params": with_priority({"max_new_tokens": 0}, priority),
            "return_logprob": True, "logprob_start_len": logprob_start_len, **lora_kw(lora_path)})
        if isinstance(outs, dict):
            outs = [outs]
        return [[(e[0], e[1]) for e in o["meta_info"]["input_token_logprobs"]] for o in outs]

    def get_model_info(self) -> dict[str, Any]:
        with self._lock:
            if self._model_info is None:
                self._model_info = self._request("GET", "/get_model_info")
            return self._model_info

    def chat_template(self) -> ChatTemplate:
        if self._template is None:
            info = self.get_model_info()
            self._template = ChatTemplate(info.get("chat_template"), info.get("special_tokens_map"))
        return self._template

    def get_model_name(self) -> str:
        """The served model's path (SGLang's ``RuntimeEndpoint.get_model_name``)."""
        return self.get_model_info()["model_path"]

    def flush_cache(self) -> bool:
        try:
            return bool(self._request("POST", "/flush_cache").get("success"))
        except BackendError as e:
            if e.status == 400:  # refused while requests are running
                return False
            raise

    def get_server_info(self) -> dict[str, Any]:
        return self._request("GET", "/get_server_info")

    def shutdown(self) -> None:
        self._client.close()
