"""Backends: where a frontend_lang program's calls run.

Owns: ``base.Backend`` (the contract the interpreter calls: generate, cache_prefix, tokenize,
prompt_logprobs, chat_template, flush_cache, get_server_info, shutdown),
``runtime_endpoint.RuntimeEndpoint`` (a running radixserve or SGLang-style server over HTTP:
``/generate``, ``/tokenize``, ...) and ``engine_backend`` (``EngineBackend`` over an in-process
``radixserve.Engine``; ``Runtime`` builds one from a model path).
Must not touch: the runtime's internals -- only its HTTP routes or the Engine's public API,
never its scheduler; program state belongs to ``frontend_lang.state``.  Of radixserve it
imports only ``engine`` and ``tokenizer``, both lazily (an HTTP-only program never loads torch).

Public names: ``__all__``.
"""
from frontend_lang.backend.base import Backend
from frontend_lang.backend.engine_backend import EngineBackend, Runtime
from frontend_lang.backend.runtime_endpoint import RuntimeEndpoint

__all__ = ["Backend", "EngineBackend", "Runtime", "RuntimeEndpoint"]
