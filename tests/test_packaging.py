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


def test_wheel_ships_the_cpu_kernel_source(tmp_path):
    """The C++ source is compiled on the user's machine, so the wheel must carry it."""
    import subprocess
    import sys
    import zipfile
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path), str(root)], check=True, capture_output=True, timeout=300)
    (wheel,) = tmp_path.glob("radixserve-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {"radixserve/kernels/cpu/paged_attention.cpp", "radixserve/kernels/cpu/fused_ops.cpp",
            "radixserve/kernels/cpu/common.h"} <= set(names)
    assert "radixserve/kernels/cpu_native.py" in names
