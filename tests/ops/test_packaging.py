"""The Triton kernels ship as radixserve.kernels, and transformers, which probes for Hugging
Face's own `kernels` package, must not mistake ours for it."""
from __future__ import annotations

import pytest


def test_kernels_import_under_radixserve():
    pytest.importorskip("triton")
    import radixserve.kernels as k

    assert k.__name__ == "radixserve.kernels" and callable(k.decode_attention_fwd)


def test_a_bare_kernels_import_never_gets_ours():
    """Run from the repository root (so the folder kernels/ is on sys.path), a bare ``import
    kernels`` gets Hugging Face's package when it is installed (transformers >= 5.25 needs it
    and imports names from it), and transformers still imports; without it, transformers
    must not take our folder for it."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = ("import transformers.integrations.hub_kernels, kernels\n"
            "from transformers.utils import import_utils\n"
            "print(getattr(kernels, '__file__', None)); print(import_utils.is_kernels_available())")
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    where, available = out.stdout.split()[-2:]
    ours = os.path.join(root, "kernels")
    assert not where.startswith(ours) if available == "True" else where.startswith(ours)


def test_wheel_ships_the_cpu_kernel_source(tmp_path):
    """The C++ source is compiled on the user's machine, so the wheel must carry it (and the
    dashboard's static files, which the server reads from the package), and the build finds every
    folder it ships listed in pyproject's packages (setuptools warns about one that is not)."""
    import re
    import subprocess
    import sys
    import zipfile
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    # -v: pip shows the build backend's output, where setuptools warns about package data folders
    # that are not listed as packages
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v", "-w",
                          str(tmp_path), str(root)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    absent = sorted(set(re.findall(r"Package '([\w.]+)' is absent from the `packages` configuration",
                                   out.stdout + out.stderr)))
    assert not absent, f"list these in pyproject.toml's [tool.setuptools] packages: {absent}"
    (wheel,) = tmp_path.glob("radixserve-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {"radixserve/kernels/cpu/paged_attention.cpp", "radixserve/kernels/cpu/fused_ops.cpp",
            "radixserve/kernels/cpu/common.h"} <= set(names)
    assert "radixserve/kernels/cpu_native.py" in names
    # every package of the source tree ships (a package missing from pyproject's list imports
    # in an editable install and fails in a real one)
    for init in [*root.glob("radixserve/**/__init__.py"), *root.glob("frontend_lang/**/__init__.py")]:
        rel = init.relative_to(root).as_posix()
        assert rel in names, f"{rel} is not in the wheel: add its package to pyproject.toml"
    # the cache inspector's page is package data too (served from the installed package)
    assert {f"radixserve/server/inspector/dashboard/{f}" for f in ("dashboard.html", "dashboard.css", "dashboard.js",
                                                          "charts.js", "icicle.js", "tree_view.js")} <= set(names)
