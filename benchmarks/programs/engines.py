"""The engines the programs suite runs on, each started the way its users run it, behind one
small interface: ``Engine.backend`` (a ``frontend_lang`` backend), ``counters()`` (the engine's
own token counters, cumulative), ``reset()`` (empty its prefix cache) and ``close()``.

* ``radixserve-http``: ``radixserve serve`` + ``RuntimeEndpoint``; counters from
  ``/get_server_info`` (``forward_tokens``: tokens the model ran) and ``/cache/stats``;
* ``radixserve``: in process, ``frontend_lang.Runtime``; the same counters from the Engine;
* ``sglang-client``: SGLang's own client (``sglang_client.py``) against ``radixserve serve``;
* ``vllm-server``: vLLM's OpenAI server (prefix caching on) + ``CompletionsBackend``;
  counters from its Prometheus ``/metrics``;
* ``vllm-offline``: vLLM's ``LLM`` in its own Python + ``OfflineBatchBackend``; counters from
  its ``RequestOutput``s;
* ``llama.cpp``: llama-cpp-python's server on the same GGUF + ``CompletionsBackend``.

Counter names (all engines): ``prompt_tokens``, ``cached_tokens`` (prompt tokens the prefix
cache served), ``generation_tokens``, ``computed_tokens`` (tokens the model actually ran: prompt
tokens not cached + generated ones, or the engine's own count where it keeps one).
"""
from __future__ import annotations

import os
import re
import secrets
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import httpx

from benchmarks.peer_procs import LLAMA, VLLM, find_python
from benchmarks.programs.completions_backend import VLLM as VLLM_FLAVOR
from benchmarks.programs.completions_backend import CompletionsBackend, llama_flavor

ENGINES = ("radixserve-http", "radixserve", "sglang-client", "vllm-server", "vllm-offline", "llama.cpp")
RUNNERS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "peer_runners")


@dataclass
class Engine:
    name: str
    backend: Any
    counters: Callable[[], dict[str, int]]
    reset: Callable[[], None]
    close: Callable[[], None]
    info: dict[str, Any] = field(default_factory=dict)
    run_cell: Optional[Callable[..., dict[str, Any]]] = None  # (workload, concurrency) -> cell; None: run.py's
    fresh_per_workload: bool = False  # run.py starts it anew for each workload


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen, log: str, timeout: float = 900.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: the server exited with {proc.returncode}; log {log}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    proc.kill()
    raise RuntimeError(f"{url}: not ready after {timeout:.0f} s; log {log}")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def prom(text: str, name: str) -> float:
    """Sum of a Prometheus metric's samples (every label set) in ``text``."""
    total = 0.0
    for m in re.finditer(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? ([0-9.eE+-]+)$", text, re.M):
        total += float(m.group(1))
    return total


def tokenizer_and_template(hf_dir: str) -> tuple[Any, Any]:
    from frontend_lang.chat_template import ChatTemplate
    from radixserve.tokenizer import load_hf_tokenizer, load_light_tokenizer

    hf = load_hf_tokenizer(hf_dir)
    specials = {k: v for k, v in hf.special_tokens_map.items() if isinstance(v, str)}
    return load_light_tokenizer(hf_dir), ChatTemplate(hf.chat_template, specials)


# ---------------------------------------------------------------------- radixserve
def radix_counts(sched: dict[str, Any], cache: dict[str, Any]) -> dict[str, int]:
    totals = cache["windows"]["since_start"]
    return {"prompt_tokens": int(totals["prompt_tokens"]), "cached_tokens": int(totals["cached_tokens"]),
            "computed_tokens": int(sched["forward_tokens"]), "forward_steps": int(sched["forward_steps"])}


def settle(url: str) -> None:
    """Wait until the server has loaded its chat tokenizer: it imports transformers after
    ``/health`` first answers (seconds of a core, beside the first requests); a chat request
    waits for that load, so the cells measure the server as it runs, not its start."""
    model = httpx.get(url + "/v1/models", timeout=60).json()["data"][0]["id"]
    httpx.post(url + "/v1/chat/completions", timeout=300, json={
        "model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}).raise_for_status()


def radixserve_http(model: str, dtype: str, extra: list[str], logdir: str, client: str = "frontend_lang") -> Engine:
    """``radixserve serve`` driven by ``frontend_lang``'s RuntimeEndpoint, or with ``client``
    "sglang" by SGLang's own client."""
    port = free_port()
    name = "radixserve-http" if client == "frontend_lang" else "sglang-client"
    log = os.path.join(logdir, f"{name}.log")
    cmd = [sys.executable, "-m", "radixserve.cli", "serve", "--model", model, "--port", str(port),
           "--dtype", dtype, "--log-level", "warning", *extra]
    proc = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/health", proc, log)
    settle(url)
    run_cell = None
    if client == "frontend_lang":
        from frontend_lang import RuntimeEndpoint

        backend: Any = RuntimeEndpoint(url)
        close_backend, flush = backend.shutdown, backend.flush_cache
    else:
        from benchmarks.programs.sglang_client import import_sglang, run_cell_sglang

        try:
            sgl = import_sglang()
        except ImportError as e:
            stop(proc)
            raise RuntimeError(f"SGLang's client is not installed ({e}); `make install` installs it") from None
        backend = sgl.RuntimeEndpoint(url)
        close_backend = lambda: None  # noqa: E731
        flush = lambda: httpx.post(url + "/flush_cache", timeout=60)  # noqa: E731
        run_cell = lambda wl, conc: run_cell_sglang(wl, backend, conc, sgl)  # noqa: E731

    def counters() -> dict[str, int]:
        sched = httpx.get(url + "/get_server_info", timeout=30).json()["scheduler"]
        out = radix_counts(sched, httpx.get(url + "/cache/stats", timeout=30).json())
        out["generation_tokens"] = int(prom(httpx.get(url + "/metrics", timeout=30).text,
                                            "radixserve:generation_tokens_total"))
        return out

    def close() -> None:
        close_backend()
        stop(proc)

    return Engine(name, backend, counters, lambda: flush() and None, close, {"command": " ".join(cmd[1:])},
                  run_cell)


def radixserve_inproc(model: str, dtype: str, extra: list[str]) -> Engine:
    """``frontend_lang.Runtime`` on the Engine that ``radixserve serve`` would build from the same
    flags (``extra``: the HTTP engine's ``--server-arg``s), so both run one configuration."""
    from frontend_lang import Runtime
    from radixserve.cli import engine_config_from_args, parse_args

    args = parse_args(["serve", "--model", model, "--dtype", dtype, *extra])
    rt = Runtime(config=engine_config_from_args(args))
    eng = rt.engine
    generated = {"n": 0}

    def counters() -> dict[str, int]:
        out = radix_counts(eng.stats(), eng.run_on_driver(lambda s: s.kv.cache_stats()))
        out["generation_tokens"] = generated["n"]
        return out

    # generation tokens: what the Engine returned (it keeps no counter of its own)
    generate = eng.generate

    def counting_generate(*args: Any, **kw: Any) -> Any:
        outs = generate(*args, **kw)
        for o in outs if isinstance(outs, list) else [outs]:
            generated["n"] += int(o["meta_info"].get("completion_tokens", 0))
        return outs

    eng.generate = counting_generate
    return Engine("radixserve", rt, counters, lambda: eng.flush_cache() and None, rt.shutdown,
                  {"flags": " ".join(["--dtype", dtype, *extra])})


# ---------------------------------------------------------------------- vLLM
def vllm_env(python: str) -> dict[str, str]:
    """vLLM's CPU settings (as vllm_runner.py) with tcmalloc and libiomp5 preloaded."""
    code = "from vllm_runner import preload_libs; print(':'.join(preload_libs('iomp')))"
    libs = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True,
                          cwd=RUNNERS).stdout.strip()  # python -c imports from its working folder
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": "0,1", "VLLM_CPU_KVCACHE_SPACE": "4",
           "VLLM_SERVER_DEV_MODE": "1", "BENCH_PEERS_PRELOADED": "1"}
    if libs:
        env["LD_PRELOAD"] = libs
    return env


def vllm_server(hf_dir: str, dtype: str, logdir: str, python: Optional[str]) -> Engine:
    py, why = find_python(VLLM, python)
    if py is None:
        raise RuntimeError(why)
    tok, template = tokenizer_and_template(hf_dir)
    port = free_port()
    log = os.path.join(logdir, "vllm-server.log")
    cmd = [py, "-m", "vllm.entrypoints.openai.api_server", "--model", hf_dir, "--served-model-name", "m",
           "--dtype", dtype, "--enable-prefix-caching", "--max-model-len", "4096", "--port", str(port),
           "--seed", "0"]
    env = {**vllm_env(py), "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    proc = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/health", proc, log)
    backend = CompletionsBackend(url, "m", tok, template, VLLM_FLAVOR)

    def counters() -> dict[str, int]:
        text = httpx.get(url + "/metrics", timeout=30).text
        prompt, cached = prom(text, "vllm:prompt_tokens_total"), prom(text, "vllm:prompt_tokens_cached_total")
        gen = prom(text, "vllm:generation_tokens_total")
        return {"prompt_tokens": int(prompt), "cached_tokens": int(cached), "generation_tokens": int(gen),
                "computed_tokens": int(prompt - cached + gen)}

    def reset() -> None:
        httpx.post(url + "/reset_prefix_cache", timeout=60)

    def close() -> None:
        backend.shutdown()
        stop(proc)

    return Engine("vllm-server", backend, counters, reset, close, {"command": " ".join(cmd[1:]), "python": py})


def vllm_offline(hf_dir: str, dtype: str, logdir: str, python: Optional[str]) -> Engine:
    from benchmarks.programs.offline_backend import OfflineBatchBackend

    py, why = find_python(VLLM, python)
    if py is None:
        raise RuntimeError(why)
    tok, template = tokenizer_and_template(hf_dir)
    port, key = free_port(), secrets.token_bytes(16)
    log = os.path.join(logdir, "vllm-offline.log")
    opts = '{"dtype": "%s"}' % dtype
    proc = subprocess.Popen([py, os.path.join(RUNNERS, "vllm_programs.py"), hf_dir, str(port), key.hex(), opts],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            env={**os.environ, "VLLM_CPU_OMP_THREADS_BIND": "0,1", "VLLM_CPU_KVCACHE_SPACE": "4",
                                 "VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    deadline = time.time() + 900
    backend = None
    while backend is None:
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            raise RuntimeError(f"vLLM offline runner did not start; log {log}")
        try:
            backend = OfflineBatchBackend(port, key, tok, template)
        except (ConnectionRefusedError, OSError):
            time.sleep(2.0)

    def counters() -> dict[str, int]:
        c = backend.stats()
        return {"prompt_tokens": c["prompt_tokens"], "cached_tokens": c["cached_tokens"],
                "generation_tokens": c["generation_tokens"],
                "computed_tokens": c["prompt_tokens"] - c["cached_tokens"] + c["generation_tokens"],
                "batches": c["batches"]}

    def close() -> None:
        backend.shutdown()
        stop(proc)

    return Engine("vllm-offline", backend, counters, lambda: backend.reset_cache() and None, close, {"python": py})


# ---------------------------------------------------------------------- llama.cpp
def llama_server(gguf: str, hf_dir: str, logdir: str, python: Optional[str]) -> Engine:
    """llama-cpp-python's server: one sequence at a time (it has no batching of requests), the
    previous request's KV reused for the longest common prefix, a RAM cache of earlier prompts'
    states (``--cache``: what brings a fork's shared prefix back after a branch ran); no
    ``logits_all`` (its echo logprobs cannot score ``select``: completions_backend.py).  Started
    anew for each workload: with ``--cache`` its process grows by about twice a saved state
    (~29 MB here) per request (15 GB after 244 requests on a 24 GiB machine, then the kernel's OOM
    killer ended it)."""
    py, why = find_python(LLAMA, python)
    if py is None:
        raise RuntimeError(why)
    tok, template = tokenizer_and_template(hf_dir)

    def schema_to_gbnf(schema: str) -> str:
        code = ("import sys; from llama_cpp.llama_grammar import json_schema_to_gbnf; "
                "sys.stdout.write(json_schema_to_gbnf(sys.stdin.read()))")
        return subprocess.run([py, "-c", code], input=schema, capture_output=True, text=True, check=True).stdout

    port = free_port()
    log = os.path.join(logdir, "llama-server.log")
    cmd = [py, "-m", "llama_cpp.server", "--model", gguf, "--model_alias", "m", "--n_ctx", "4096",
           "--n_threads", str(os.cpu_count() or 2), "--n_batch", "512", "--logits_all", "false", "--cache", "true",
           "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/v1/models", proc, log)
    cache: dict[str, str] = {}

    def gbnf(schema: str) -> str:
        if schema not in cache:
            cache[schema] = schema_to_gbnf(schema)
        return cache[schema]

    from radixserve.tokenizer import eos_token_ids

    eos = sorted(eos_token_ids(tok, hf_dir))
    backend = CompletionsBackend(url, "m", tok, template, llama_flavor(gbnf, eos))

    def counters() -> dict[str, int]:
        # llama.cpp keeps no counters: its log says, per request, how much of the prompt it reused
        # and how much it ran; the generated tokens are what its responses' usage reports
        with open(log, errors="replace") as f:
            runs = re.findall(r"Llama\.generate: (\d+) prefix-match hit, remaining (\d+) prompt tokens", f.read())
        hits, evals = sum(int(h) for h, _ in runs), sum(int(e) for _, e in runs)
        gen = backend.generated_tokens
        return {"prompt_tokens": hits + evals, "cached_tokens": hits, "generation_tokens": gen,
                "computed_tokens": evals + gen}

    def close() -> None:
        backend.shutdown()
        stop(proc)

    return Engine("llama.cpp", backend, counters, lambda: None, close, {"command": " ".join(cmd[1:]), "python": py},
                  fresh_per_workload=True)
