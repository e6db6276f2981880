"""Kernels for attention over the paged KV pool (page size 1).

* Triton kernels (``decode_attention``, ``extend_attention``, ``kv_store``): importing them
  requires triton.  Under ``TRITON_INTERPRET=1`` they run on CPU tensors (that is how
  tests/test_kernels.py checks them).
* ``cpu_native``: the native C++ CPU kernel, compiled on first use (no triton needed).

Importable only as ``radixserve.kernels`` (pyproject maps this folder there); never as a
bare ``kernels`` module.  The Triton names below are imported lazily, so that importing
``radixserve.kernels.cpu_native`` never imports triton.
"""
from __future__ import annotations

import importlib
from typing import Any

_TRITON = {"alloc_decode_buffers": "decode_attention", "decode_attention_fwd": "decode_attention",
           "extend_attention_fwd": "extend_attention", "store_kv": "kv_store"}

__all__ = list(_TRITON)


def __getattr__(name: str) -> Any:
    if name in _TRITON:
        return getattr(importlib.import_module(f"radixserve.kernels.{_TRITON[name]}"), name)
    raise AttributeError(f"module 'radixserve.kernels' has no attribute {name!r}")
