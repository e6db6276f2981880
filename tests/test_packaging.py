"""The Triton kernels ship as radixserve.kernels, and transformers, which probes for Hugging
Face's own `kernels` package, must not mistake ours for it."""
from __future__ import annotations

import pytest


def test_kernels_import_under_radixserve():
    pytest.importorskip("triton")
    import radixserve.kernels as k

    assert k.__name__ == "radixserve.kernels" and callable(k.decode_attention_fwd)


def test_transformers_does_not_see_a_kernels_package():
    from transformers.utils import import_utils

    assert not import_utils.is_kernels_available()
