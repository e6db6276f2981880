"""The timing protocol every peer of bench_peers.py goes through, in-process or as a subprocess.

Standard library only: the peer-runner scripts next to this file run under the peers' own
Python (llama.cpp's and vLLM's virtual environments), where radixserve is not installed.

A *job* is a JSON object: ``single`` (``prompts``: 1 warm-up + r + r distinct prompts,
``output_len``), batch workloads (``prompts`` as token ids and ``output_lens``) under the
names listed in ``batch_order`` (default ``shared_prefix``, ``sharegpt``; each optional),
``warmup`` (prompts for a short untimed batch) and ``options`` (peer-specific).  A peer is any object with:

* ``generate_one(prompt, n) -> list[int]``: n greedy tokens, EOS ignored;
* ``run_batch(prompts, output_lens) -> dict``: ``outputs`` (token ids per request),
  optionally ``cached_per_request`` (prompt tokens it reused), ``time_s``/``extra`` to
  override the measured wall time (extrapolation) and add fields;
* ``reset_cache()``: forget every cached prefix (after warm-ups).
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Any, Callable, Optional


def rates(n_in: int, n_out: int, secs: float) -> dict[str, float]:
    """Wall time and input / output / total tokens per second."""
    return {"time_s": secs, "input_tok_s": n_in / secs, "output_tok_s": n_out / secs,
            "total_tok_s": (n_in + n_out) / secs}


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """(seconds, result) of one call, by ``time.perf_counter``."""
    t0 = time.perf_counter()
    value = fn()
    return time.perf_counter() - t0, value


def single_stream(peer: Any, prompts: list[list[int]], n_out: int) -> dict[str, Any]:
    """One request at a time: after a warm-up, r runs of 1 token and r runs of ``n_out`` tokens,
    each on its own prompt (so no prefix cache helps).  decode tok/s = (n_out - 1) / (median
    time of n_out tokens - median time of 1 token): the prefill and the first token cancel out."""
    peer.generate_one(prompts[0], n_out)
    r = (len(prompts) - 1) // 2
    t1 = [timed(lambda p=p: peer.generate_one(p, 1))[0] for p in prompts[1: 1 + r]]
    runs = [timed(lambda p=p: peer.generate_one(p, n_out)) for p in prompts[1 + r: 1 + 2 * r]]
    bad = [len(out) for _, out in runs if len(out) != n_out]
    if bad:
        raise RuntimeError(f"single stream: asked for {n_out} tokens, got {bad}")
    first, full = statistics.median(t1), statistics.median(t for t, _ in runs)
    return {"prompt_len": len(prompts[0]), "output_len": n_out, "repeats": r, "first_token_s": first,
            "time_s": full, "e2e_tok_s": n_out / full, "decode_tok_s": (n_out - 1) / max(full - first, 1e-9),
            "output_ids": runs[0][1]}


def batch_workload(peer: Any, prompts: list[list[int]], output_lens: list[int]) -> dict[str, Any]:
    """All requests through ``peer.run_batch`` once, timed; rates over the whole workload."""
    peer.reset_cache()
    secs, out = timed(lambda: peer.run_batch(prompts, output_lens))
    secs = out.get("time_s", secs)
    n_in, n_out = sum(map(len, prompts)), sum(output_lens)
    done = out["outputs"]
    short = [i for i, (o, n) in enumerate(zip(done, output_lens)) if len(o) != n]
    if short:
        raise RuntimeError(f"requests {short[:5]} did not generate their output length")
    res: dict[str, Any] = {**rates(n_in, n_out, secs), "requests": len(prompts), "prompt_tokens": n_in,
                           "completion_tokens": n_out, "outputs": done}
    cached: Optional[list[int]] = out.get("cached_per_request")
    if cached is not None:
        res.update(cached_per_request=cached, cached_tokens=sum(cached), hit_rate=sum(cached) / max(1, n_in))
    res.update(out.get("extra", {}))
    return res


DEFAULT_BATCHES = ("shared_prefix", "sharegpt")


def batch_names(job: dict[str, Any]) -> list[str]:
    """Names of the job's batch workloads, in the order they run."""
    return [w for w in job.get("batch_order", DEFAULT_BATCHES) if job.get(w)]


def batches(job: dict[str, Any]) -> list[tuple[list[list[int]], list[int]]]:
    """(prompts, output_lens) of the job's batch workloads."""
    return [(job[w]["prompts"], job[w]["output_lens"]) for w in batch_names(job)]


def longest_request(job: dict[str, Any]) -> int:
    """Prompt + output tokens of the job's longest batch request (0 without any)."""
    return max([len(p) + n for prompts, lens in batches(job) for p, n in zip(prompts, lens)] + [0])


def run_job(peer: Any, job: dict[str, Any], log: Callable[[str], None] = print) -> dict[str, Any]:
    """Warm up, then every workload the job names, in order: single, then ``batch_names(job)``."""
    results: dict[str, Any] = {}
    if job.get("warmup"):
        peer.run_batch(job["warmup"], [8] * len(job["warmup"]))
    if job.get("single"):
        log(f"single stream ... (load average {os.getloadavg()[0]:.2f})")
        load = os.getloadavg()[0]
        results["single"] = single_stream(peer, job["single"]["prompts"], job["single"]["output_len"])
        results["single"]["loadavg_1m"] = [load, os.getloadavg()[0]]
        log(f"  decode {results['single']['decode_tok_s']:.1f} tok/s")
    for name in batch_names(job):
        load = os.getloadavg()[0]
        log(f"{name}: {len(job[name]['prompts'])} requests ... (load average {load:.2f})")
        results[name] = batch_workload(peer, job[name]["prompts"], job[name]["output_lens"])
        results[name]["loadavg_1m"] = [load, os.getloadavg()[0]]
        log(f"  {results[name]['total_tok_s']:.1f} tok/s in {results[name]['time_s']:.2f} s")
    return results


def runner_main(make_peer: Callable[[dict[str, Any]], tuple[Any, dict[str, Any]]]) -> None:
    """Entry point of a peer-runner script: ``python X_runner.py JOB.json OUT.json``.
    ``make_peer(job)`` returns (peer, info about its configuration); progress goes to stderr."""
    job_path, out_path = sys.argv[1], sys.argv[2]
    with open(job_path) as f:
        job = json.load(f)
    def log(s: str) -> None:
        print("bench_peers: " + s.strip(), file=sys.stderr, flush=True)

    startup, (peer, info) = timed(lambda: make_peer(job))
    log(f"started in {startup:.1f} s (untimed)")
    info["startup_s"] = startup
    results = run_job(peer, job, log=log)
    with open(out_path, "w") as f:
        json.dump({"info": info, **results}, f)


def reused_prefix(cached: list[int], prompt: list[int]) -> int:
    """How many prompt tokens ``Llama.generate`` takes from its KV instead of computing them:
    the longest common prefix, one less when it covers the whole prompt (that token is replayed)."""
    n = 0
    for a, b in zip(cached, prompt):
        if a != b:
            break
        n += 1
    return n - 1 if n == len(prompt) else n
