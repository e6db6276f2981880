"""The native CPU kernels built for an AVX2-only CPU (``RADIXSERVE_CPU_MARCH=x86-64-v3``: no
AVX-512, no AMX) still build, load and pass the kernel tests.  The development machines vary
(AMD EPYC with AVX2 only among them) and CI's CPU may have AVX-512, so the AVX2 code is
compiled and run here on whatever CPU runs the suite; an AVX2 binary runs on any newer x86."""
from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 only")


def _flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return f" {f.read()} ".replace("\n", " ")
    except OSError:
        return ""


@pytest.mark.skipif(" avx2 " not in _flags(), reason="this CPU cannot run AVX2 code")
@pytest.mark.skipif(" avx2 " in _flags() and " avx512f " not in _flags(),
                    reason="an AVX2 CPU without AVX-512: the library built for it (-march=native) compiles the same "
                           "AVX2 branches, and the suite's kernel tests ran them")
def test_the_avx2_build_passes_the_kernel_tests(tmp_path):
    # a cache of its own (timings, scales: nothing measured for the native build is reused),
    # but the machine's compiled libraries: the AVX2 library is built once per change of the
    # sources, compiler, flags, torch or CPU (all in the library's hash, kernels/cpu_native.py);
    # and its GGUF conversions (SmolLM2's 0.5 GB Hugging Face directory: a file format, nothing
    # measured), converted once per GGUF file, not once per run
    from radixserve.model.loader import cache_root

    for shared in ("kernels", "gguf", "gguf-tokenizers"):
        os.makedirs(os.path.join(cache_root(), shared), exist_ok=True)
        os.symlink(os.path.join(cache_root(), shared), tmp_path / shared)
    env = {**os.environ, "RADIXSERVE_CPU_MARCH": "x86-64-v3", "RADIXSERVE_CACHE": str(tmp_path)}
    check = ("from radixserve.kernels import cpu_native; import torch;"
             "assert cpu_native.load(), cpu_native._state;"
             "print([op for op in ('paged_attention', 'int8_linear', 'blocked_linear', 'silu_mul', 'add_rms_norm', 'rope_')"
             " if hasattr(torch.ops.radixserve_cpu, op)])")
    built = subprocess.run([sys.executable, "-c", check], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    assert all(op in built.stdout
               for op in ("paged_attention", "int8_linear", "blocked_linear", "silu_mul", "add_rms_norm", "rope_"))
    # the same cache: the tests load the AVX2 library just built (a skip would hide a failure: -rs);
    # not the Triton kernels (run under the interpreter, they never call the native library: the
    # suite's own run of them covers them)
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-rs",
                            "tests/kernels/test_attention_cpu.py", "tests/kernels/test_fused_ops.py", "tests/core/test_quant.py",
                            "tests/kernels/test_blocked_linear.py", "tests/kernels/test_blocked_exact.py",
                            "tests/kernels/test_attention_window.py",
                            "-k", "not engine and not smollm2 and not triton"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    tail = tests.stdout[-3000:]
    assert tests.returncode == 0, tail + tests.stderr[-2000:]
    assert "native CPU kernels did not build" not in tail and " passed" in tail
