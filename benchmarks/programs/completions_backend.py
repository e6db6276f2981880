"""A ``frontend_lang`` backend over an OpenAI-compatible ``/v1/completions`` server: how the
programs suite drives vLLM's and llama-cpp-python's servers, the way their users run such
programs (lm-eval-harness for ``select``, parallel requests for ``fork``).

* ``gen``: one completion request on the program's text (``temperature``, ``max_tokens``,
  ``stop``; a regex or a JSON schema through the server's structured outputs, where it has them);
* ``select``: prompt logprobs of every prefix+choice as lm-eval-harness asks them
  (``echo: true, logprobs: 0, max_tokens: 0``; all choices in one request);
* the prefix hint (``cache_prefix``): a 1-token completion on the prefix, so a server with a
  prefix cache holds it before the branches start, as radixserve's hint does;
* tokenization: the model's own tokenizer, locally (the one every engine loads).

A feature the server lacks raises ``BackendError(..., 501)``: the runner reports the workload
as not runnable on that peer instead of timing a different program.
"""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any, Callable, Optional

import httpx

from frontend_lang.backend.base import Backend, TokenLogprob
from frontend_lang.chat_template import ChatTemplate
from frontend_lang.errors import BackendError


@dataclass(frozen=True)
class Flavor:
    """What one server accepts.  ``regex`` / ``json_schema`` / ``ignore_eos``: the body fields
    for a constraint or for generating past EOS (None: not supported)."""

    name: str
    regex: Optional[Callable[[str], dict[str, Any]]]
    json_schema: Optional[Callable[[str], dict[str, Any]]]
    ignore_eos: Optional[dict[str, Any]]
    token_prompts: bool = True  # False: prompts are text only (token ids are sent decoded)
    no_prompt_logprobs: str = ""  # why the server's echo logprobs cannot score a select ("" = they can)


VLLM = Flavor("vLLM", regex=lambda r: {"structured_outputs": {"regex": r}},
              json_schema=lambda s: {"structured_outputs": {"json": s if isinstance(s, dict) else json.loads(s)}},
              ignore_eos={"ignore_eos": True})


def llama_flavor(schema_to_gbnf: Optional[Callable[[str], str]], eos_ids: list[int]) -> Flavor:
    """llama-cpp-python's server: no regex constraint; a JSON schema as the GBNF grammar its
    own converter writes (``schema_to_gbnf``, run under the peer's Python); no ``ignore_eos``,
    so EOS is kept from being sampled by a logit bias, as its users do."""
    schema = None if schema_to_gbnf is None else (
        lambda s: {"grammar": schema_to_gbnf(s if isinstance(s, str) else json.dumps(s))})
    return Flavor("llama.cpp", regex=None, json_schema=schema, token_prompts=False,
                  ignore_eos={"logit_bias": {str(t): -100.0 for t in eos_ids}},
                  no_prompt_logprobs=(
                      "usable prompt logprobs: llama-cpp-python 0.3.36's echo pairs each prompt token with the "
                      "distribution that predicts the next one (llama.py: zip(all_tokens, "
                      "logits_to_logprobs(self._scores)[token_offset:])), so select is not run there"))


class CompletionsBackend(Backend):
    def __init__(self, base_url: str, model: str, tokenizer: Any, template: ChatTemplate, flavor: Flavor,
                 timeout: float = 900.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.tok = tokenizer
        self.template = template
        self.flavor = flavor
        self._client = httpx.Client(base_url=self.base_url, timeout=httpx.Timeout(timeout, connect=10.0),
                                    limits=httpx.Limits(max_connections=256, max_keepalive_connections=128))
        self._tok_lock = threading.Lock()
        self.generated_tokens = 0  # completion tokens of gen requests, from the responses' usage

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        try:
            resp = self._client.post("/v1/completions", json={"model": self.model, **body})
        except httpx.HTTPError as e:
            raise BackendError(f"{self.flavor.name}: {type(e).__name__}: {e}") from None
        if resp.status_code >= 400:
            raise BackendError(f"{self.flavor.name}: HTTP {resp.status_code}: {resp.text[:500]}", resp.status_code)
        return resp.json()

    def _unsupported(self, what: str) -> BackendError:
        return BackendError(f"{self.flavor.name} has no {what}", 501)

    def _body(self, params: dict[str, Any]) -> dict[str, Any]:
        body: dict[str, Any] = {"temperature": params.get("temperature", 1.0),
                                "max_tokens": params.get("max_new_tokens", 128)}
        for name in ("top_p", "top_k", "stop", "seed", "frequency_penalty", "presence_penalty"):
            if params.get(name) is not None:
                body[name] = params[name]
        if params.get("ignore_eos"):
            if self.flavor.ignore_eos is None:
                raise self._unsupported("ignore_eos")
            body.update(self.flavor.ignore_eos)
        for key, build in (("regex", self.flavor.regex), ("json_schema", self.flavor.json_schema)):
            if params.get(key) is not None:
                if build is None:
                    raise self._unsupported(f"{key} constraint")
                body.update(build(params[key]))
        rest = set(params) - {"temperature", "max_new_tokens", "top_p", "top_k", "stop", "seed", "ignore_eos",
                              "regex", "json_schema", "frequency_penalty", "presence_penalty", "priority"}
        if rest:
            raise self._unsupported(f"sampling parameter(s) {sorted(rest)}")
        return body

    # ------------------------------------------------------------------ Backend
    def generate(self, text: str, sampling_params: dict[str, Any], options: dict[str, Any],
                 on_text: Optional[Callable[[str], None]] = None) -> tuple[str, dict[str, Any]]:
        if options.get("return_logprob") or options.get("lora_path"):
            raise self._unsupported("logprobs or LoRA in gen")
        out = self._post({"prompt": text, **self._body(sampling_params)})
        choice = out["choices"][0]
        usage = out.get("usage") or {}
        with self._tok_lock:
            self.generated_tokens += int(usage.get("completion_tokens") or 0)
        if on_text is not None:
            on_text(choice["text"])
        return choice["text"], {"finish_reason": choice.get("finish_reason"),
                                "prompt_tokens": usage.get("prompt_tokens"),
                                "completion_tokens": usage.get("completion_tokens")}

    def cache_prefix(self, text: Optional[str] = None, input_ids: Optional[list[int]] = None,
                     priority: Optional[int] = None, lora_path: Optional[str] = None) -> None:
        prompt: Any = text if input_ids is None else list(input_ids)
        if input_ids is not None and not self.flavor.token_prompts:
            with self._tok_lock:
                prompt = self.tok.decode(prompt)
        self._post({"prompt": prompt, "max_tokens": 1, "temperature": 0.0})

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        with self._tok_lock:  # a Rust tokenizer object is not shared across threads
            return [self.tok.encode(t) for t in texts]

    def prompt_logprobs(self, input_ids: list[list[int]], logprob_start_len: int,
                        priority: Optional[int] = None, lora_path: Optional[str] = None) -> list[list[TokenLogprob]]:
        if self.flavor.no_prompt_logprobs:
            raise self._unsupported(self.flavor.no_prompt_logprobs)
        body = {"echo": True, "logprobs": 0, "max_tokens": 0, "temperature": 0.0}
        choices = sorted(self._post({"prompt": [list(p) for p in input_ids], **body})["choices"],
                         key=lambda c: c["index"])
        rows = []
        for ids, choice in zip(input_ids, choices):
            lps = choice["logprobs"]["token_logprobs"][:len(ids)]
            if len(lps) != len(ids):
                raise BackendError(f"{self.flavor.name}: {len(lps)} prompt logprobs for {len(ids)} tokens")
            rows.append([(None if lp is None else float(lp), tid)
                         for lp, tid in zip(lps, ids)][logprob_start_len:])
        return rows

    def chat_template(self) -> ChatTemplate:
        return self.template

    def shutdown(self) -> None:
        self._client.close()
