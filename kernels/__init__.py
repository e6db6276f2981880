"""Kernels: attention over the paged KV pool (page size 1) and the native CPU ops.

Owns (tuning history in ``kernels/README.md``):

* Triton kernels (``decode_attention``, ``extend_attention``, ``kv_store``; helpers in
  ``_utils``, a layer's sliding window and logit soft-cap in ``_attn_mods``): importing them
  requires triton.  Under ``TRITON_INTERPRET=1`` they run on CPU tensors (that is how
  tests/kernels/test_kernels.py checks them).
* ``cpu_native``: the native C++ library of ``cpu/*.cpp`` (paged attention, fused ops, int8 and
  blocked linears, the layer stack, argmax, the packed-KV store, multi-LoRA's segmented products)
  as ``torch.ops.radixserve_cpu``, compiled on first use and cached (no triton needed); ``load()``
  is False where it cannot build.
* ``kv_formats``: the ``kv_format`` codes of a packed (int8/fp8) KV pool, shared by both kinds.

Must not touch: anything of radixserve -- it imports none of it (``attention``, ``model`` and
``worker`` call in); a kernel writes only its outputs and the KV slots it is handed (it
never chooses or frees slots).  Public names: ``__all__`` (the Triton entry points, imported lazily: see
below) and the ``cpu_native`` module, imported by name.

Importable as ``radixserve.kernels`` (pyproject maps this folder there).  With the
repository root on ``sys.path`` (``python -m ...`` run from it) this folder would also be
found as a bare ``kernels`` and shadow Hugging Face's ``kernels`` package, which
transformers >= 5.25 requires and imports: imported under that name, this file hands the
import over to the real package when one is installed (below).  The Triton names are
imported lazily, so that importing ``radixserve.kernels.cpu_native`` never imports triton.
"""
from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import sys
from typing import Any


def _hand_over_to_the_installed_kernels() -> None:
    """Replace this module in ``sys.modules`` by the ``kernels`` package found on ``sys.path``
    without the repository root; the import then returns that one.  None found: stay (a
    module without ``__version__``, which transformers treats as absent)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != root]
    spec = importlib.machinery.PathFinder.find_spec("kernels", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["kernels"] = module
    spec.loader.exec_module(module)


if __name__ == "kernels":
    _hand_over_to_the_installed_kernels()

_TRITON = {"alloc_decode_buffers": "decode_attention", "decode_attention_fwd": "decode_attention",
           "extend_attention_fwd": "extend_attention", "store_kv": "kv_store"}

__all__ = list(_TRITON)


def __getattr__(name: str) -> Any:
    if name in _TRITON:
        return getattr(importlib.import_module(f"radixserve.kernels.{_TRITON[name]}"), name)
    raise AttributeError(f"module 'radixserve.kernels' has no attribute {name!r}")
