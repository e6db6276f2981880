"""JSONSchemaBench: coverage, compliance and compile time per subset and grammar backend.

A fixed sample (``--per-subset`` schemas per subset, drawn with ``random.Random(--seed)``
from the sorted file names) of guidance-ai/jsonschemabench's ``data/<Subset>/*.json``, for
each backend (``--backends``), through the in-process ``radixserve.Engine`` and its default
model (SmolLM2-135M-Instruct):

- **coverage**: schemas that compile (front-door validation plus the backend's compile,
  the same path a request takes; a refusal or a compile error/timeout is a miss);
- **compile time** p50 / p99 over the schemas that compiled: the scheduler's time from a
  request's arrival to its grammar being ready (nothing cached, one compile worker), and apart
  from it the front door's synchronous check (the 400 for a bad schema), which the HTTP server
  runs before the request reaches the scheduler;
- **compliance**: of the compiled schemas whose generation finished (``stop``, not cut by
  ``--max-new-tokens``), the share whose output validates with ``jsonschema`` against the
  schema as given, formats asserted (``FORMAT_CHECKER``: the formats whose checker libraries are
  installed); all generations of a
  backend run in one batched ``generate`` call at temperature 0.  An output that does not
  validate means the grammar weakened the schema: the script lists each one.

The data are read from ``--data``: a checkout (``<dir>/data/<Subset>/*.json``) or the bare
git mirror (read with ``git cat-file``); nothing is fetched.  Without it the script says
so and exits 0.

    .venv/bin/python -m benchmarks.bench_jsonschemabench --json-out benchmarks/results/jsonschemabench.json
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from typing import Optional

import numpy as np

from benchmarks.report import write_json

MIRROR = "/work/.mirror/guidance-ai+jsonschemabench/repo"
SUBSETS = ["Github_trivial", "Github_easy", "Github_medium", "Github_hard", "Github_ultra", "Glaiveai2K",
           "JsonSchemaStore", "Kubernetes", "Snowplow", "WashingtonPost"]
PROMPT_CHARS = 400  # the prompt shows the schema's start: generation is CPU-bound here


class Data:
    """Schema files of a checkout or of a (bare) git mirror."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.git = not os.path.isdir(os.path.join(path, "data")) and os.path.exists(os.path.join(path, "HEAD"))

    def available(self) -> bool:
        return self.git or os.path.isdir(os.path.join(self.path, "data"))

    def files(self, subset: str) -> list[str]:
        if self.git:
            out = subprocess.run(["git", "-C", self.path, "ls-tree", "--name-only", "HEAD", f"data/{subset}/"],
                                 check=True, capture_output=True, text=True).stdout
            return sorted(x for x in out.split() if x.endswith(".json"))
        folder = os.path.join(self.path, "data", subset)
        return sorted(f"data/{subset}/{x}" for x in os.listdir(folder) if x.endswith(".json"))

    def read(self, name: str) -> str:
        if self.git:
            return subprocess.run(["git", "-C", self.path, "show", f"HEAD:{name}"], check=True,
                                  capture_output=True, text=True).stdout
        with open(os.path.join(self.path, name)) as f:
            return f.read()


def sample(data: Data, per_subset: int, seed: int) -> list[tuple[str, str, dict]]:
    """(subset, file, schema) for the fixed sample; files that are not a JSON object are skipped."""
    out = []
    for sub in SUBSETS:
        files = data.files(sub)
        picked = sorted(random.Random(f"{seed}-{sub}").sample(files, min(per_subset, len(files))))
        for name in picked:
            try:
                schema = json.loads(data.read(name))
            except ValueError:
                continue
            if isinstance(schema, dict):
                out.append((sub, name, schema))
    return out


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q)) if xs else float("nan")


def compile_all(eng, schemas: list[dict], backend: str) -> list[tuple[Optional[float], Optional[float], Optional[str]]]:
    """Per schema, sequentially, the path a request takes: (compile seconds, check seconds, None)
    or (None, None, error).  ``check``: the front door's synchronous validation (request_builder,
    in the HTTP server's process); ``compile``: the scheduler's, from the request's arrival to its
    grammar being ready (the source, unchecked as the scheduler builds it, and the backend's compile)."""
    from radixserve.constrained.schema.spec import constraint_of
    from radixserve.sampling_params import SamplingParams

    def run(sched) -> list:
        mgr = sched.grammars
        be = mgr.get_backend()  # vocabulary, tokenizer trie or compile process: outside the timings
        warm = constraint_of(SamplingParams(regex="(warm|up)"), "", backend)
        be.request(warm)
        while be.poll(warm) is None:
            be.inflight[warm.key].exception()
        res = []
        for s in schemas:
            sp = SamplingParams(json_schema=s)
            t0 = time.perf_counter()
            try:
                constraint_of(sp, backend=backend)  # the front door's check (verify_sampling)
                t1 = time.perf_counter()
                c = constraint_of(sp, sched.cfg.json_whitespace_pattern, backend, validate=False)
                be.request(c)
                got = be.poll(c)
                while got is None:
                    fut = be.inflight.get(c.key)
                    if fut is not None:
                        fut.exception()  # blocks until this compilation ends
                    got = be.poll(c)
            except ValueError as e:
                got = e
            t2 = time.perf_counter()
            res.append((None, None, str(got)[:300]) if isinstance(got, Exception) else (t2 - t1, t1 - t0, None))
        return res

    return eng.run_on_driver(run)


def prompt_of(tok, schema: dict) -> str:
    text = json.dumps(schema)
    if len(text) > PROMPT_CHARS:
        text = text[:PROMPT_CHARS] + " ..."
    msg = f"Write one JSON document that is valid against this JSON schema:\n{text}"
    return tok.apply_chat_template([{"role": "user", "content": msg}], tokenize=False, add_generation_prompt=True)


def validates(schema: dict, text: str) -> tuple[bool, str]:
    import jsonschema

    try:
        doc = json.loads(text)
    except ValueError as e:
        return False, f"not JSON: {e}"
    try:
        cls = jsonschema.validators.validator_for(schema)
        cls(schema, format_checker=cls.FORMAT_CHECKER).validate(doc)  # formats asserted, as the grammar does
    except jsonschema.ValidationError as e:
        return False, f"{e.message} at {list(e.absolute_path)}"
    except Exception as e:  # noqa: BLE001 - a schema jsonschema itself cannot handle
        return False, f"jsonschema: {type(e).__name__}: {e}"
    return True, ""


def run_backend(backend: str, items: list, args) -> dict:
    from radixserve import Engine

    eng = Engine(args.model, dtype=args.dtype, max_total_tokens=args.max_total_tokens, grammar_backend=backend,
                 grammar_compile_timeout=args.compile_timeout, grammar_cache_size=4 * len(items) + 8)
    t0 = time.perf_counter()
    comp = compile_all(eng, [s for _, _, s in items], backend)
    compile_wall = time.perf_counter() - t0
    ok = [i for i, (dt, _, _) in enumerate(comp) if dt is not None]
    t1 = time.perf_counter()
    outs = eng.generate([prompt_of(eng.tokenizer, items[i][2]) for i in ok],
                        [{"json_schema": items[i][2], "max_new_tokens": args.max_new_tokens, "temperature": 0,
                          "constraint_budget": args.constraint_budget} for i in ok]) if ok else []
    gen_wall = time.perf_counter() - t1
    per: dict = {}
    bad = []
    for sub in SUBSETS:
        per[sub] = {"n": 0, "compiled": 0, "finished": 0, "valid": 0, "compile_s": [], "check_s": []}
    for i, (sub, name, schema) in enumerate(items):
        per[sub]["n"] += 1
        if comp[i][0] is not None:
            per[sub]["compiled"] += 1
            per[sub]["compile_s"].append(comp[i][0])
            per[sub]["check_s"].append(comp[i][1])
    for i, o in zip(ok, outs):
        sub, name, schema = items[i]
        if o["meta_info"]["finish_reason"]["type"] != "stop":
            continue
        per[sub]["finished"] += 1
        good, why = validates(schema, o["text"])
        per[sub]["valid"] += good
        if not good:
            bad.append({"file": name, "why": why, "text": o["text"][:300]})
    errors = {items[i][1]: e for i, (_, _, e) in enumerate(comp) if e is not None}
    eng.shutdown()
    return {"per_subset": per, "invalid": bad, "compile_errors": errors, "compile_wall_s": compile_wall,
            "generate_wall_s": gen_wall}


def table(results: dict) -> str:
    lines = ["| subset | backend | n | coverage | compliance (valid / finished) | compile p50 | compile p99 "
             "| front-door check p50 | check p99 |", "|---|---|---|---|---|---|---|---|---|"]
    for sub in SUBSETS + ["overall"]:
        for b, r in results.items():
            per = r["per_subset"]
            rows = list(per.values()) if sub == "overall" else [per[sub]]
            n = sum(x["n"] for x in rows)
            c = sum(x["compiled"] for x in rows)
            f = sum(x["finished"] for x in rows)
            v = sum(x["valid"] for x in rows)
            ts = [t for x in rows for t in x["compile_s"]]
            cs = [t for x in rows for t in x.get("check_s", [])]  # the xgrammar peer has no front door
            comp = f"{100 * v / f:.0f}% ({v}/{f})" if f else "-"
            check = f"{1e3 * pct(cs, 50):.1f} ms | {1e3 * pct(cs, 99):.1f} ms" if cs else "- | -"
            lines.append(f"| {sub} | {b} | {n} | {100 * c / max(n, 1):.0f}% ({c}) | {comp} | "
                         f"{1e3 * pct(ts, 50):.1f} ms | {1e3 * pct(ts, 99):.1f} ms | {check} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=MIRROR, help="jsonschemabench checkout or git mirror")
    p.add_argument("--backends", default="llguidance,outlines,xgrammar",
                   help="radixserve's grammar backends, and xgrammar as a peer (skipped when not installed)")
    p.add_argument("--xgrammar-batch", type=int, default=32)
    p.add_argument("--constraint-budget", default="cut", choices=["cut", "close"],
                   help="radixserve's backends: cut at --max-new-tokens, or steer to close (docs/STRUCTURED_OUTPUT.md)")
    p.add_argument("--per-subset", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--compile-timeout", type=float, default=10.0)
    p.add_argument("--model", default=None)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--max-total-tokens", type=int, default=80000)
    p.add_argument("--json-out", default=None)
    args = p.parse_args()
    data = Data(args.data)
    if not data.available():
        print(f"JSONSchemaBench data not found at {args.data}: skipped (pass --data <checkout or mirror>)")
        return 0
    items = sample(data, args.per_subset, args.seed)
    print(f"{len(items)} schemas from {len(SUBSETS)} subsets (seed {args.seed})", flush=True)
    results = {}
    for b in args.backends.split(","):
        if b == "xgrammar":  # a peer: transformers + xgrammar's masks (benchmarks/xgrammar_peer.py)
            from benchmarks import xgrammar_peer

            why = xgrammar_peer.available()
            if why:
                print(f"xgrammar: skipped: {why}", flush=True)
                continue
            results[b] = xgrammar_peer.run_xgrammar(items, args, prompt_of, validates, SUBSETS)
        else:
            results[b] = run_backend(b, items, args)
        r = results[b]
        print(f"{b}: compile {r['compile_wall_s']:.1f} s, generate {r['generate_wall_s']:.1f} s, "
              f"{len(r['invalid'])} invalid outputs", flush=True)
        for x in r["invalid"]:
            print(f"   INVALID {x['file']}: {x['why']}\n      {x['text']!r}")
    print(table(results))
    write_json(args.json_out, {"args": vars(args), "files": [f for _, f, _ in items], "results": results,
                               "table": table(results)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
