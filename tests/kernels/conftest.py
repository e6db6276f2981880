"""Fixtures of the kernel tests (plain helpers live in tests/helpers/)."""
from __future__ import annotations

import pytest


@pytest.fixture
def bf16_mode():
    """``use(path)`` runs the native CPU kernel's bf16 pools on ``path``: 0 fp32 tiles, 1 AVX-512
    bf16 tiles, 2 AMX blocks, or ``(mode, True)`` with AVX512-BF16 dot products as well
    (``run_cpu``); skips the test where this build or CPU lacks it.  The best mode and no dot
    products are restored afterwards."""
    import torch

    # imported here, not at collection: test_kernels.py must set TRITON_INTERPRET before
    # radixserve.kernels is first imported
    from tests.helpers.cpu_attention import DOT, set_bf16_mode

    best = set_bf16_mode(2)

    def use(path) -> None:
        mode, dot = path if isinstance(path, tuple) else (path, False)
        if set_bf16_mode(mode) != mode:
            pytest.skip(f"bf16 path {mode} is not available here (best: {best})")
        if dot and int(torch.ops.radixserve_cpu.attention_bf16_dot(1)) != 1:
            pytest.skip("this build has no AVX512-BF16 dot products")
        DOT["on"] = dot

    yield use
    DOT["on"] = False
    torch.ops.radixserve_cpu.attention_bf16_dot(0)
    set_bf16_mode(best)
