"""Warm restart: time to the first cached hit after a restart, with and without
``--cache-persist-dir``.

Three server runs on one model: (1) a primer with a persist dir answers one request with a
``--system-len``-token system prompt and is stopped with SIGTERM (its final save: the bytes
written and the stop time); (2) a cold restart without the dir; (3) a warm restart with it.
On (2) and (3) two requests follow at once, each ``system + its own 32-token question`` with
``max_new_tokens=1`` (its latency is the TTFT).  "first hit" is the time from launching the
server to the answer of the first request that reports ``cached_tokens >= system-len``: the
first request when warm, the second when cold (the first computes the prefix).  The warm
server's load time is read from its log.  Token ids are random (``--seed``).

    python -m benchmarks.bench_warm_restart                    # SmolLM2-135M, 2,000-token prompt
    python -m benchmarks.bench_warm_restart --model DIR --system-len 300
"""
from __future__ import annotations

import argparse
import os
import random
import re
import tempfile
import time
from typing import Any, Optional

from benchmarks.report import write_json
from tests.helpers.server_harness import ServerHandle

from radixserve.worker.persist.store import FILE_NAME

_LOADED = re.compile(r"loaded (\d+) of (\d+) persisted tokens \((\d+) nodes\) in ([0-9.]+)s")
_WRITTEN = re.compile(r"persisted (\d+) cached tokens .* in ([0-9.]+)s")


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(200, 40000) for _ in range(n)]


def _request(srv: ServerHandle, ids: list[int], max_new: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    with srv.client(timeout=600) as c:
        out = c.post("/generate", json={"input_ids": ids, "sampling_params": {
            "max_new_tokens": max_new, "temperature": 0, "ignore_eos": True}}).raise_for_status().json()
    return time.perf_counter() - t0, out["meta_info"]["cached_tokens"]


def _launch(model: str, args: list[str]) -> tuple[ServerHandle, float]:
    t0 = time.perf_counter()
    srv = ServerHandle(model, "--log-level", "info", *args)
    srv.wait_ready(600)
    return srv, time.perf_counter() - t0


def _stop(srv: ServerHandle) -> float:
    t0 = time.perf_counter()
    srv.stop()
    return time.perf_counter() - t0


def restart_run(model: str, folder: Optional[str], system: list[int], questions: list[list[int]],
                common: list[str]) -> dict[str, Any]:
    """One restart: launch, two requests sharing ``system``, stop."""
    srv, ready = _launch(model, common + (["--cache-persist-dir", folder] if folder else []))
    try:
        lat = [_request(srv, system + q, 1) for q in questions]
        log = srv.log_tail(1 << 20)
    finally:
        _stop(srv)
    hit = next((i for i, (_, cached) in enumerate(lat) if cached >= len(system)), None)
    m = _LOADED.search(log)
    return {"ready_s": ready, "ttft_s": [t for t, _ in lat], "cached_tokens": [c for _, c in lat],
            "first_hit_s": None if hit is None else ready + sum(t for t, _ in lat[:hit + 1]),
            "loaded_tokens": int(m.group(1)) if m else 0, "load_s": float(m.group(4)) if m else None}


def run(model: str, system_len: int, max_total_tokens: int, seed: int = 0, dtype: str = "float32") -> dict[str, Any]:
    rng = random.Random(seed)
    system = _ids(rng, system_len)
    q0, q1, q2 = _ids(rng, 32), _ids(rng, 32), _ids(rng, 32)
    common = ["--max-total-tokens", str(max_total_tokens), "--dtype", dtype]
    with tempfile.TemporaryDirectory(prefix="rs-warm-") as folder:
        srv, _ = _launch(model, common + ["--cache-persist-dir", folder])
        try:
            _request(srv, system + q0, 8)
        finally:
            stop_s = _stop(srv)
        m = _WRITTEN.search(srv.log_tail(1 << 20))
        path = os.path.join(folder, FILE_NAME)
        written = os.path.getsize(path) if os.path.exists(path) else 0
        cold = restart_run(model, None, system, [q1, q2], common)
        warm = restart_run(model, folder, system, [q1, q2], common)
    return {"model": model, "system_len": system_len, "dtype": dtype, "file_bytes": written,
            "saved_tokens": int(m.group(1)) if m else 0, "write_s": float(m.group(2)) if m else None,
            "primer_stop_s": stop_s, "cold": cold, "warm": warm}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct")
    ap.add_argument("--system-len", type=int, default=2000)
    ap.add_argument("--max-total-tokens", type=int, default=16384)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json-out", default=None)
    a = ap.parse_args()
    from radixserve.model.loader import resolve_hf_dir

    res = run(a.model or resolve_hf_dir(None), a.system_len, a.max_total_tokens, a.seed, a.dtype)
    print(f"model {res['model']}, {a.dtype}, system prompt {a.system_len} tokens")
    write = "?" if res["write_s"] is None else f"{res['write_s']:.2f}s"
    print(f"primer: wrote {res['saved_tokens']} tokens, {res['file_bytes'] / 2**20:.1f} MiB at shutdown in {write}; "
          f"stopping the server took {res['primer_stop_s']:.2f}s")
    for name in ("cold", "warm"):
        r = res[name]
        hit = "none" if r["first_hit_s"] is None else f"{r['first_hit_s']:.2f}s"
        load = "" if r["load_s"] is None else f", loaded {r['loaded_tokens']} tokens in {r['load_s']:.2f}s"
        print(f"{name}: ready {r['ready_s']:.2f}s{load}; TTFT {', '.join(f'{t:.3f}s' for t in r['ttft_s'])} "
              f"(cached {r['cached_tokens']}); launch -> first cached hit {hit}")
    write_json(a.json_out, res)


if __name__ == "__main__":
    main()
