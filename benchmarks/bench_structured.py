"""Structured generation: compile time, mask cost, jump-forward speedup, validity, idle overhead.

Per grammar backend (``--backends``, default both: llguidance and outlines-core), with the
default model SmolLM2-135M-Instruct, fp32 on the CPU:

1. **Compile time per grammar**: ``{"type": "object"}`` (what ``response_format``
   ``json_object`` maps to), every JSON schema and every regex of
   tests/constrained_cases.py, each through the front door's translation and validation
   (``constraint_of``, memo caches cleared) and then the backend's compile, on a fresh
   backend (nothing cached, one compile worker): p50 / p99 / max of the wall time.
2. **Per-token grammar cost** in the scheduler, measured during the jump-forward-off run
   of (3): mask (``GrammarManager.mask``) and advance + completion/jump checks
   (``after_token`` + ``after_stop``) per emitted token, in microseconds (mean and p99),
   plus the mask-cache hit rate (outlines: per-state LRU; llguidance: the current
   position's mask reused within a step).
3. **JSON extraction**: ``--requests`` prompts, each a short text about a person and the
   same 6-field schema (name, age, city, job, email, employed), temperature 0, all in
   one ``generate`` call; throughput with jump-forward off and on (the compiled grammar is
   warm in both), compact JSON (``json_whitespace_pattern=""``: every separator is forced).
   **Validity**: every regex and schema of the test set plus ``{"type": "object"}`` at
   temperature 0 in one batch: finished outputs that validate (``--no-validity`` skips it).
4. **Unconstrained overhead** (default backend): ``--requests`` unconstrained prompts, 32
   greedy tokens each (``ignore_eos``), with the scheduler's grammar manager swapped between
   one that never loaded anything and the loaded one; after two warm-up runs, alternated
   ``--repeats`` times, median wall time of each (``--no-overhead`` skips it).

    .venv/bin/python -m benchmarks.bench_structured --json-out benchmarks/results/structured.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

import numpy as np

from tests.helpers.constrained_cases import REGEX_TOKENS, REGEXES, SCHEMA_TOKENS, SCHEMAS, valid
from benchmarks.report import write_json

from radixserve import Engine

PEOPLE = [("Alice Martin", 34, "Paris", "engineer"), ("Bob Chen", 51, "Toronto", "teacher"),
          ("Carla Diaz", 27, "Madrid", "nurse"), ("David Okafor", 45, "Lagos", "architect"),
          ("Eva Novak", 38, "Prague", "chemist"), ("Farid Haddad", 62, "Beirut", "pilot"),
          ("Grace Kim", 29, "Seoul", "designer"), ("Hugo Rossi", 41, "Milan", "chef")]
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "city": {"type": "string", "maxLength": 16}, "occupation": {"type": "string", "maxLength": 16},
    "email_address": {"type": "string", "maxLength": 24}, "currently_employed": {"type": "boolean"}},
    "required": ["name", "age", "city", "occupation", "email_address", "currently_employed"]}


def pct(xs, q):
    return float(np.percentile(np.asarray(xs), q)) if xs else float("nan")


def bench_compile(eng: Engine, backend_name: str) -> dict:
    """Compile time per grammar with ``backend_name``: the front door's translation and
    validation (``constraint_of``, memo caches cleared) plus the backend's compile, on a
    fresh backend (nothing cached, one worker, its process or thread started first)."""
    from radixserve.constrained.runtime.registry import make_backend
    from radixserve.constrained.schema.json_schema import schema_to_regex  # noqa: F401 - imported outside the timings
    from radixserve.constrained.schema.llg_spec import llguidance_source
    from radixserve.constrained.schema.spec import _schema_regex, constraint_of
    from radixserve.sampling_params import SamplingParams

    cfg = dataclasses.replace(eng.scheduler.cfg, grammar_backend=backend_name, grammar_compile_workers=1)
    backend = make_backend(eng.tokenizer, eng.runner.vocab_size, eng.scheduler.stops.eos_ids, cfg)
    backend._submit(constraint_of(SamplingParams(regex="(warm|up)"), "", backend_name).source).result()
    ws = cfg.json_whitespace_pattern
    out = {"setup_s": backend.setup_seconds}
    cases = (("json_object", [(None, {"type": "object"})]), ("json_schema", SCHEMAS), ("regex", REGEXES))
    for kind, items in cases:
        times = []
        for _, spec in items:
            _schema_regex.cache_clear()
            llguidance_source.cache_clear()
            t0 = time.perf_counter()
            c = constraint_of(SamplingParams(**{"regex" if kind == "regex" else "json_schema": spec}), ws, backend_name)
            backend._submit(c.source).result()
            times.append(time.perf_counter() - t0)
        out[kind] = {"n": len(times), "p50_ms": pct(times, 50) * 1e3, "p99_ms": pct(times, 99) * 1e3,
                     "max_ms": max(times) * 1e3, "total_s": sum(times)}
    every = [t for k, _ in cases for t in [out[k]["total_s"]]]
    backend.close()
    out["all_total_s"] = sum(every)
    return out


def bench_validity(eng: Engine) -> dict:
    """Every regex and schema of the test set (plus json_object), temperature 0, one batch:
    how many outputs finish and validate."""
    import jsonschema  # noqa: F401

    prompts, params, kinds = [], [], []
    for p, rx in REGEXES:
        prompts.append(p)
        params.append({"regex": rx, "max_new_tokens": REGEX_TOKENS, "temperature": 0})
        kinds.append(("regex", rx))
    for p, schema in SCHEMAS + [("Describe Paris as a JSON object:", {"type": "object"})]:
        prompts.append(p)
        params.append({"json_schema": schema, "max_new_tokens": SCHEMA_TOKENS, "temperature": 0})
        kinds.append(("json", schema))
    t0 = time.perf_counter()
    outs = eng.generate(prompts, params)
    dt = time.perf_counter() - t0
    eng.flush_cache()
    finished = [(o, k) for o, k in zip(outs, kinds) if o["meta_info"]["finish_reason"]["type"] == "stop"]
    bad = [o["text"] for o, k in finished if not valid(k[0], k[1], o["text"])]
    return {"n": len(outs), "finished": len(finished), "valid": len(finished) - len(bad), "invalid": bad, "wall_s": dt}


def extraction_prompts(n: int) -> list[str]:
    out = []
    for i in range(n):
        name, age, city, job = PEOPLE[i % len(PEOPLE)]
        first = name.split()[0].lower()
        out.append(f"<|im_start|>user\n{name} is a {age + i // len(PEOPLE)} year old {job} from {city}. "
                   f"Reach {first} at {first}@example.com; {first} works full time.\n"
                   f"Extract the person as JSON.<|im_end|>\n<|im_start|>assistant\n")
    return out


class Timer:
    """Wraps GrammarManager methods to time them per call."""

    def __init__(self, mgr) -> None:
        self.mgr, self.mask_us, self.token_us = mgr, [], []
        self.orig = (mgr.mask, mgr.after_token, mgr.after_stop)
        mask, after_token, after_stop = self.orig

        def t_mask(req):
            t0 = time.perf_counter()
            m = mask(req)
            self.mask_us.append((time.perf_counter() - t0) * 1e6)
            return m

        def t_after_token(req):
            t0 = time.perf_counter()
            ok = after_token(req)
            self._t = time.perf_counter() - t0
            return ok

        def t_after_stop(req, jf):
            t0 = time.perf_counter()
            r = after_stop(req, jf)
            self.token_us.append((self._t + time.perf_counter() - t0) * 1e6)
            return r

        mgr.mask, mgr.after_token, mgr.after_stop = t_mask, t_after_token, t_after_stop

    def restore(self) -> None:
        self.mgr.mask, self.mgr.after_token, self.mgr.after_stop = self.orig


def run_extraction(eng: Engine, n: int, max_new: int, timer_out: dict = None) -> dict:
    prompts = extraction_prompts(n)
    params = {"json_schema": SCHEMA, "max_new_tokens": max_new, "temperature": 0}
    eng.generate(prompts[:1], params)  # compile + warm
    eng.flush_cache()
    res = {}
    for jf in (False, True):
        eng.scheduler.cfg = dataclasses.replace(eng.scheduler.cfg, enable_jump_forward=jf)
        mgr = eng.scheduler.grammars
        timer = Timer(mgr) if (timer_out is not None and not jf) else None
        hits0, built0 = mgr.backend.mask_hits, len(mgr.backend.mask_build_seconds)
        j0 = mgr.jumped_tokens
        t0 = time.perf_counter()
        outs = eng.generate(prompts, params)
        dt = time.perf_counter() - t0
        eng.flush_cache()
        if timer is not None:
            timer.restore()
            built = len(mgr.backend.mask_build_seconds) - built0
            hits = mgr.backend.mask_hits - hits0
            timer_out.update(mask_us_mean=statistics.mean(timer.mask_us), mask_us_p99=pct(timer.mask_us, 99),
                             token_us_mean=statistics.mean(timer.token_us), token_us_p99=pct(timer.token_us, 99),
                             mask_calls=len(timer.mask_us), mask_cache_hit_rate=hits / max(1, hits + built),
                             mask_build_ms_mean=1e3 * statistics.mean(mgr.backend.mask_build_seconds or [0]))
        toks = sum(o["meta_info"]["completion_tokens"] for o in outs)
        ok = sum(1 for o in outs if _valid(o["text"]))
        res["on" if jf else "off"] = {"wall_s": dt, "req_per_s": n / dt, "out_tok_per_s": toks / dt,
                                      "completion_tokens": toks, "valid": ok,
                                      "jumped_tokens": mgr.jumped_tokens - j0, "sample": outs[0]["text"]}
    res["speedup"] = res["off"]["wall_s"] / res["on"]["wall_s"]
    eng.scheduler.cfg = dataclasses.replace(eng.scheduler.cfg, enable_jump_forward=True)
    return res


def _valid(text: str) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), SCHEMA)
        return True
    except Exception:  # noqa: BLE001
        return False


def run_unconstrained(eng: Engine, n: int) -> float:
    prompts = [f"Story number {i}: once upon a time" for i in range(n)]
    t0 = time.perf_counter()
    eng.generate(prompts, {"max_new_tokens": 32, "temperature": 0, "ignore_eos": True})
    dt = time.perf_counter() - t0
    eng.flush_cache()
    return dt


def bench_overhead(args, report: dict) -> None:
    """(4): the default backend's machinery loaded vs never loaded, unconstrained traffic."""
    eng = Engine(args.model, dtype=args.dtype, max_total_tokens=30000)
    run_unconstrained(eng, 4)  # warm-up
    from radixserve.constrained.manager import GrammarManager

    sched = eng.scheduler
    fresh = GrammarManager(sched.cfg, sched.stops.tokenizer, sched.vocab_size, sched.stops.eos_ids)
    run_unconstrained(eng, args.requests)  # a second warm-up at full size, not counted
    base, loaded = [], []
    # load the grammar machinery: backend, compile process or threads, a compiled grammar and its masks
    eng.generate("Extract:", {"json_schema": SCHEMA, "max_new_tokens": 8, "temperature": 0})
    eng.flush_cache()
    with_mgr = sched.grammars
    for _ in range(args.repeats):  # alternate, so load changes on the machine hit both sides
        loaded.append(run_unconstrained(eng, args.requests))
        sched.grammars = fresh  # a manager that never loaded anything
        base.append(run_unconstrained(eng, args.requests))
        sched.grammars = with_mgr
    u = report["unconstrained"] = {"requests": args.requests, "without_s": statistics.median(base),
                                   "with_s": statistics.median(loaded), "runs_without": base, "runs_with": loaded}
    u["overhead_pct"] = 100.0 * (u["with_s"] / u["without_s"] - 1.0)
    print(f"unconstrained, {args.requests} x 32 tokens: without grammar machinery {u['without_s']:.2f} s, "
          f"with {u['with_s']:.2f} s ({u['overhead_pct']:+.1f}%)", flush=True)


def bench_backend(args, name: str) -> dict:
    """(1) compile times, (2) per-token cost, (3) jump-forward speedup, validity, for one backend."""
    rep: dict = {}
    eng = Engine(args.model, dtype=args.dtype, max_total_tokens=30000, grammar_backend=name)
    rep["compile"] = c = bench_compile(eng, name)
    for kind in ("json_object", "json_schema", "regex"):
        k = c[kind]
        print(f"[{name}] compile {kind:11s}: n={k['n']} p50 {k['p50_ms']:.1f} ms, p99 {k['p99_ms']:.1f} ms, "
              f"max {k['max_ms']:.1f} ms", flush=True)
    if args.validity:
        rep["validity"] = v = bench_validity(eng)
        print(f"[{name}] test set at temperature 0: {v['valid']}/{v['finished']} finished outputs valid "
              f"({v['n']} requests, {v['wall_s']:.1f} s)", flush=True)
    mask: dict = {}
    rep["extraction_compact_ws"] = r = run_extraction(eng, args.requests, args.max_new_tokens, mask)
    rep["mask_cost"] = mask
    print(f"[{name}] mask per sampled token: mean {mask['mask_us_mean']:.1f} us, p99 {mask['mask_us_p99']:.1f} us "
          f"(hit rate {100 * mask['mask_cache_hit_rate']:.1f}%, a build takes {mask['mask_build_ms_mean']:.2f} ms); "
          f"advance+checks per token: mean {mask['token_us_mean']:.1f} us, p99 {mask['token_us_p99']:.1f} us", flush=True)
    print(f"[{name}] extraction: off {r['off']['wall_s']:.2f} s ({r['off']['out_tok_per_s']:.1f} tok/s, "
          f"{r['off']['valid']} valid), on {r['on']['wall_s']:.2f} s ({r['on']['out_tok_per_s']:.1f} tok/s, "
          f"{r['on']['valid']} valid, {r['on']['jumped_tokens']} tokens jumped): {r['speedup']:.2f}x", flush=True)
    print(f"   sample: {r['on']['sample']}")
    eng.shutdown()
    return rep


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--backends", default="llguidance,outlines")
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--validity", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--overhead", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--json-out", default=None)
    args = p.parse_args()
    report: dict = {}
    if args.overhead:
        bench_overhead(args, report)
    for name in args.backends.split(","):
        report[name] = bench_backend(args, name)
    write_json(args.json_out, report)


if __name__ == "__main__":
    main()
