"""Ready time of the default model: radixserve, vLLM's CPU build and llama.cpp's server, side by side.

Each engine is started ``--runs`` times as its users start it on the same model (radixserve: ``radixserve
serve`` on the default SmolLM2 GGUF with every option at its default, on warm caches: one untimed
start first fills them; vLLM: its OpenAI server on the HF folder radixserve converted the GGUF to,
prefix caching on, ``--dtype`` as given; llama.cpp: llama-cpp-python's server on the GGUF itself).
Timed from the launch to the first answered completion of one token (the health route alone can
answer before a model is usable), with the CPU seconds the engine's processes used by then.  A peer
whose Python is missing (``$BENCH_VLLM_PYTHON``, ``$BENCH_LLAMA_PYTHON``) is skipped, saying so.
radixserve's stage lines (``radixserve/proc/stages.py``) are printed from the last start's log.

    .venv/bin/python -m benchmarks.bench_ready --runs 3 [--skip vllm,llama] [--vllm-dtype bfloat16]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Optional

import httpx

from benchmarks.peer_procs import LLAMA, VLLM, find_python
from benchmarks.programs.engines import free_port, vllm_env


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and all its descendants (from /proc)."""
    total, todo, tick = 0.0, [pid], os.sysconf("SC_CLK_TCK")
    while todo:
        p = todo.pop()
        try:
            fields = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])) / tick
            for task in os.listdir(f"/proc/{p}/task"):
                kids = open(f"/proc/{p}/task/{task}/children").read().split()
                todo.extend(int(k) for k in kids)
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
    return total


def time_start(cmd: list[str], model: str, env: Optional[dict] = None, timeout: float = 900.0) -> tuple[float, float, str]:
    """(seconds to the first answered completion, CPU seconds by then, the log's text)."""
    port = free_port()
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    t0 = time.perf_counter()
    proc = subprocess.Popen([*cmd, "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1/completions"
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{cmd[0]} exited with {proc.returncode}: {open(log.name).read()[-2000:]}")
            if time.perf_counter() - t0 > timeout:
                raise RuntimeError(f"not ready after {timeout:.0f} s: {open(log.name).read()[-2000:]}")
            try:
                r = httpx.post(url, json={"model": model, "prompt": "Hi", "max_tokens": 1, "temperature": 0},
                               timeout=5)
                if r.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        ready = time.perf_counter() - t0
        cpu = _cpu_seconds(proc.pid)
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
    return ready, cpu, open(log.name).read()


def report(name: str, runs: list[tuple[float, float, str]]) -> None:
    ready = [r for r, _, _ in runs]
    cpu = [c for _, c, _ in runs]
    print(f"{name:<12} ready {statistics.median(ready):6.2f} s median ({', '.join(f'{r:.2f}' for r in ready)}), "
          f"CPU {statistics.median(cpu):6.2f} s", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--skip", default="", help="comma list of: radixserve, vllm, llama")
    p.add_argument("--vllm-dtype", default="bfloat16")
    args = p.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    from radixserve.model.loader import default_model_path, resolve_hf_dir

    gguf = default_model_path()
    hf_dir = resolve_hf_dir(gguf)
    print(open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].strip(": "), f"{os.cpu_count()} CPUs")
    if "radixserve" not in skip:
        cmd = [sys.executable, "-m", "radixserve.cli", "serve", "--log-level", "info"]
        time_start(cmd, "default")  # fills the caches of a first start (untimed)
        runs = [time_start(cmd, "default") for _ in range(args.runs)]
        report("radixserve", runs)
        print("  stages:", *[ln.split("] ", 1)[-1] for ln in runs[-1][2].splitlines() if "stage" in ln
                             or "ready" in ln], sep="\n    ")
    for spec, key in ((VLLM, "vllm"), (LLAMA, "llama")):
        if key in skip:
            continue
        py, why = find_python(spec, None)
        if py is None:
            print(f"{key:<12} skipped: {why}")
            continue
        if key == "vllm":
            cmd = [py, "-m", "vllm.entrypoints.openai.api_server", "--model", hf_dir, "--served-model-name", "m",
                   "--dtype", args.vllm_dtype, "--enable-prefix-caching", "--max-model-len", "4096"]
            env = {**vllm_env(py), "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
        else:
            cmd = [py, "-m", "llama_cpp.server", "--model", gguf, "--model_alias", "m", "--n_ctx", "4096",
                   "--n_threads", str(os.cpu_count() or 2)]
            env = None
        report(key, [time_start(cmd, "m", env) for _ in range(args.runs)])


if __name__ == "__main__":
    main()
