"""The attention-backend factory: the one module that knows every backend.

``attention/base.py`` holds only the interface; each backend module imports it, and this
module imports the backends (lazily, so that importing radixserve never needs triton or
flashinfer).
"""
from __future__ import annotations

import torch

from radixserve.attention.base import AttentionBackend
from radixserve.mem_cache.kv_pool import KVPool


def create_attention_backend(name: str, kv_pool: KVPool, device: torch.device, cpu_dense=None) -> AttentionBackend:
    """Resolve ``--attention-backend`` (auto|cpu|torch_native|triton|flashinfer) to an instance.

    auto: flashinfer on CUDA when it is installed, triton on CUDA otherwise; on the CPU the
    native kernel (``cpu``) when it builds here and supports the pool's dtype, else
    torch_native (the kernel's loader has logged one warning saying why).  ``cpu_dense``: the
    cpu backend's ``DenseRule``, or a callable taking the pool and returning one (called only
    when that backend is chosen); None: its default.
    """
    if name == "auto":
        if device.type == "cuda":
            try:
                import flashinfer  # noqa: F401

                name = "flashinfer"
            except ImportError:
                name = "triton"
        else:
            from radixserve.attention import cpu_backend

            name = "cpu" if cpu_backend.available(kv_pool) else "torch_native"
    if name == "cpu":
        from radixserve.attention.cpu_backend import CpuBackend

        return CpuBackend(kv_pool, cpu_dense(kv_pool) if callable(cpu_dense) else cpu_dense)
    if name == "torch_native":
        from radixserve.attention.torch_native import TorchNativeBackend

        return TorchNativeBackend(kv_pool)
    if name == "triton":
        from radixserve.attention.triton_backend import TritonBackend

        return TritonBackend(kv_pool)
    if name == "flashinfer":
        from radixserve.attention.flashinfer_backend import FlashInferBackend

        return FlashInferBackend(kv_pool)
    raise ValueError(f"attention_backend: unknown backend {name!r} (auto|cpu|torch_native|triton|flashinfer)")
