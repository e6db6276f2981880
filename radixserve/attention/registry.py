"""The attention-backend factory: the one module that knows every backend.

``attention/base.py`` holds only the interface; each backend module imports it, and this
module imports the backends (lazily, so that importing radixserve never needs triton or
flashinfer).
"""
from __future__ import annotations

from typing import Optional

import torch

from radixserve.attention.base import AttentionBackend, LayerAttention, needed_features
from radixserve.mem_cache.kv_pool import KVPool

NAMES = ("cpu", "torch_native", "triton", "flashinfer")


def _backend_class(name: str) -> type[AttentionBackend]:
    if name == "cpu":
        from radixserve.attention.cpu_backend import CpuBackend

        return CpuBackend
    if name == "torch_native":
        from radixserve.attention.torch_native import TorchNativeBackend

        return TorchNativeBackend
    if name == "triton":
        from radixserve.attention.triton_backend import TritonBackend

        return TritonBackend
    if name == "flashinfer":
        from radixserve.attention.flashinfer_backend import FlashInferBackend

        return FlashInferBackend
    raise ValueError(f"attention_backend: unknown backend {name!r} (auto|{'|'.join(NAMES)})")


def _auto(kv_pool: KVPool, device: torch.device, needed: frozenset[str]) -> str:
    """The best backend here that computes every feature in ``needed``."""
    if device.type == "cuda" and kv_pool.quant:
        candidates = ["triton"]  # flashinfer does not read per-token scales
    elif device.type == "cuda":
        try:
            import flashinfer  # noqa: F401

            candidates = ["flashinfer", "triton"]
        except ImportError:
            candidates = ["triton"]
    else:
        from radixserve.attention import cpu_backend

        candidates = ["cpu", "torch_native"] if cpu_backend.available(kv_pool) else ["torch_native"]
    for name in candidates:
        if needed <= _backend_class(name).supported_features:
            return name
    return candidates[-1]  # set_layer_attention names what it lacks


def sliding_pool_supported(name: str) -> bool:
    """Whether backend ``name`` reads a hybrid pool's sliding layers (``KVPool.is_sliding``)
    through their own slots; "auto" chooses among those that do."""
    return name == "auto" or "sliding_pool" in _backend_class(name).supported_features


def create_attention_backend(name: str, kv_pool: KVPool, device: torch.device, cpu_dense=None,
                             layers: Optional[list[LayerAttention]] = None) -> AttentionBackend:
    """Resolve ``--attention-backend`` (auto|cpu|torch_native|triton|flashinfer) to an instance.

    auto: flashinfer on CUDA when it is installed and the pool is exact (not ``kv_pool.quant``:
    flashinfer reads no per-token scales), triton on CUDA otherwise; on the CPU the native
    kernel (``cpu``) when it builds here and supports the pool's dtype, else torch_native (the
    kernel's loader has logged one warning saying why); of those, the first that supports every
    feature ``layers`` needs.  ``cpu_dense``: the cpu backend's
    ``DenseRule``, or a callable taking the pool and returning one (called only when that
    backend is chosen); None: its default.  ``layers``: each layer's ``LayerAttention`` (the
    model's ``layer_attention()``), declared to the backend; a backend named explicitly that
    lacks a feature raises ValueError naming it.  None: every layer plain.
    """
    needed = needed_features(layers or []) | ({"sliding_pool"} if kv_pool.hybrid else frozenset())
    if kv_pool.hybrid and name != "auto" and not sliding_pool_supported(name):
        raise ValueError(f"attention_backend: the {name} backend does not read a sliding-window pool "
                         "(use disable_hybrid_swa_memory)")
    if name == "auto":
        name = _auto(kv_pool, device, needed)
    cls = _backend_class(name)
    if name == "cpu":
        backend = cls(kv_pool, cpu_dense(kv_pool) if callable(cpu_dense) else cpu_dense)
    else:
        backend = cls(kv_pool)
    if layers is not None:
        backend.set_layer_attention(layers)
    return backend
