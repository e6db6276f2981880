"""Structured generation: compile time, mask cost, jump-forward speedup, idle overhead.

Four measurements (default model SmolLM2-135M-Instruct, fp32 on the CPU):

1. **Compile time per grammar**: every JSON schema and regex of
   tests/constrained_cases.py compiled once through the compile pool (a fresh pool, one
   process, nothing cached): p50 / p99 / max of the wall time per grammar.
2. **Per-token grammar cost** in the scheduler, measured during the jump-forward-off run
   of (3): mask lookup/build (``GrammarManager.mask``) and FSM advance + completion/jump
   checks (``after_token`` + ``after_stop``) per emitted token, in microseconds (mean and
   p99), plus the mask-cache hit rate.
3. **JSON extraction**: ``--requests`` prompts, each a short text about a person and the
   same 6-field schema (name, age, city, job, email, employed), temperature 0, all in
   one ``generate`` call; throughput (requests/s and output tok/s) with jump-forward off
   and on (the compiled grammar is warm in both).  Run for the default, compact JSON
   (``json_whitespace_pattern=""``: every separator is forced), and for outlines-core's
   ``[ ]?`` between JSON tokens, where little between two values is forced.
4. **Unconstrained overhead**: ``--requests`` unconstrained prompts, 32 greedy tokens each
   (``ignore_eos``), with the scheduler's grammar manager swapped between one that never
   loaded anything and the loaded one (backend, compile process, caches); after two
   warm-up runs, alternated ``--repeats`` times, median wall time of each.

    .venv/bin/python benchmarks/bench_structured.py --json-out benchmarks/results/structured.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from constrained_cases import REGEXES, SCHEMAS  # noqa: E402
from report import write_json  # noqa: E402

from radixserve import Engine  # noqa: E402

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


def bench_compile(eng: Engine) -> dict:
    from radixserve.constrained.backend import GrammarBackend
    from radixserve.constrained.spec import constraint_of
    from radixserve.sampling_params import SamplingParams

    cfg = eng.scheduler.cfg
    backend = GrammarBackend(eng.tokenizer, eng.runner.vocab_size, eng.scheduler.stops.eos_ids, cfg)
    backend.pool.submit("(warm|up)").result()  # start the process outside the timings
    out = {"setup_s": backend.setup_seconds}
    for kind, items in (("json_schema", SCHEMAS), ("regex", REGEXES)):
        times = []
        for _, spec in items:
            c = constraint_of(SamplingParams(**{kind: spec}))
            t0 = time.perf_counter()
            backend.pool.submit(c.regex).result()
            times.append(time.perf_counter() - t0)
        out[kind] = {"n": len(times), "p50_ms": pct(times, 50) * 1e3, "p99_ms": pct(times, 99) * 1e3,
                     "max_ms": max(times) * 1e3, "total_s": sum(times)}
    backend.close()
    return out


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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--json-out", default=None)
    args = p.parse_args()
    report: dict = {}

    # (4) first: this engine has never seen a grammar
    eng = Engine(args.model, dtype=args.dtype, max_total_tokens=30000)
    run_unconstrained(eng, 4)  # warm-up
    from radixserve.constrained.manager import GrammarManager

    sched = eng.scheduler
    fresh = GrammarManager(sched.cfg, sched.stops.tokenizer, sched.vocab_size, sched.stops.eos_ids)
    run_unconstrained(eng, args.requests)  # a second warm-up at full size, not counted
    base, loaded = [], []
    # load the grammar machinery: backend, compile process, a compiled grammar and its masks
    eng.generate("Extract:", {"json_schema": SCHEMA, "max_new_tokens": 8, "temperature": 0})
    eng.flush_cache()
    with_mgr = sched.grammars
    for _ in range(args.repeats):  # alternate, so load changes on the machine hit both sides
        loaded.append(run_unconstrained(eng, args.requests))
        sched.grammars = fresh  # a manager that never loaded anything
        base.append(run_unconstrained(eng, args.requests))
        sched.grammars = with_mgr
    report["unconstrained"] = {"requests": args.requests, "without_s": statistics.median(base),
                               "with_s": statistics.median(loaded), "runs_without": base, "runs_with": loaded}
    u = report["unconstrained"]
    u["overhead_pct"] = 100.0 * (u["with_s"] / u["without_s"] - 1.0)
    print(f"unconstrained, {args.requests} x 32 tokens: without grammar machinery {u['without_s']:.2f} s, "
          f"with {u['with_s']:.2f} s ({u['overhead_pct']:+.1f}%)", flush=True)

    # (1) compile times
    report["compile"] = bench_compile(eng)
    for kind in ("json_schema", "regex"):
        c = report["compile"][kind]
        print(f"compile {kind:11s}: n={c['n']} p50 {c['p50_ms']:.0f} ms, p99 {c['p99_ms']:.0f} ms, max {c['max_ms']:.0f} ms",
              flush=True)

    # (2) + (3) JSON extraction, default (compact) whitespace, then outlines-core's "[ ]?"
    mask: dict = {}
    report["extraction_compact_ws"] = run_extraction(eng, args.requests, args.max_new_tokens, mask)
    report["mask_cost"] = mask
    print(f"mask per sampled token: mean {mask['mask_us_mean']:.1f} us, p99 {mask['mask_us_p99']:.1f} us "
          f"(hit rate {100 * mask['mask_cache_hit_rate']:.1f}%, a miss builds in {mask['mask_build_ms_mean']:.2f} ms); "
          f"advance+checks per token: mean {mask['token_us_mean']:.1f} us, p99 {mask['token_us_p99']:.1f} us", flush=True)
    del eng
    eng2 = Engine(args.model, dtype=args.dtype, max_total_tokens=30000, json_whitespace_pattern="[ ]?")
    report["extraction_outlines_ws"] = run_extraction(eng2, args.requests, args.max_new_tokens)
    for key in ("extraction_compact_ws", "extraction_outlines_ws"):
        r = report[key]
        print(f"{key}: off {r['off']['wall_s']:.2f} s ({r['off']['out_tok_per_s']:.1f} tok/s, {r['off']['valid']} valid), "
              f"on {r['on']['wall_s']:.2f} s ({r['on']['out_tok_per_s']:.1f} tok/s, {r['on']['valid']} valid, "
              f"{r['on']['jumped_tokens']} tokens jumped): {r['speedup']:.2f}x", flush=True)
        print(f"   sample: {r['on']['sample']}")
    write_json(args.json_out, report)


if __name__ == "__main__":
    main()
