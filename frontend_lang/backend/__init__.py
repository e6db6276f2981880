"""Backends: ``RuntimeEndpoint`` (HTTP server) and ``EngineBackend``/``Runtime`` (in-process)."""
from frontend_lang.backend.base import Backend
from frontend_lang.backend.engine_backend import EngineBackend, Runtime
from frontend_lang.backend.runtime_endpoint import RuntimeEndpoint

__all__ = ["Backend", "EngineBackend", "Runtime", "RuntimeEndpoint"]
