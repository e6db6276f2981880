"""Per-schema time of the structured-output front door (rewrites, llguidance grammar, validation;
uncached, best of ``--repeats``) on the JSONSchemaBench sample: what a new schema costs before its
compile, to compare two trees of radixserve schema by schema.  ``--path request`` times a request's
whole grammar path instead: that check, the scheduler's own source and the llguidance compile.

Each schema is timed on its own, back to back (one untimed call, then the best of ``--repeats``),
with Python's garbage collector paused: timed in one pass over all schemas, a schema's figure
depended on the schema before it (what it left in the caches, and a collection starts wherever
the allocation count says, which in a fixed loop is the same schema on every pass: up to ~1 ms
charged to one schema for the whole process's garbage).

The radixserve it times is the one Python imports: run it from each tree's root (the older one as a
``git worktree``) and compare the two JSON files with ``--against``:

    .venv/bin/python -m benchmarks.bench_schema_front_door --out /tmp/new.json
    (cd /work/prev && PYTHONPATH=/work/prev /work/main/.venv/bin/python -m benchmarks.bench_schema_front_door \\
        --out /tmp/old.json)        # needs this file in that tree, or run this one with PYTHONPATH set
    .venv/bin/python -m benchmarks.bench_schema_front_door --out /tmp/new.json --against /tmp/old.json
"""
from __future__ import annotations

import argparse
import gc
import json
import time

import numpy as np

from benchmarks.bench_jsonschemabench import MIRROR, Data, sample


def best_per_schema(per_subset: int, seed: int, repeats: int, once) -> dict[str, float]:
    """{schema file: ms} for the schemas ``once(schema)`` accepts (no ValueError): per schema,
    one untimed call and then the best of ``repeats`` calls back to back, the collector paused."""
    out: dict[str, float] = {}
    for _, name, schema in sample(Data(MIRROR), per_subset, seed):
        try:
            once(schema)
        except ValueError:
            continue
        best = float("inf")
        gc.disable()
        try:
            for _ in range(repeats):
                t0 = time.perf_counter()
                once(schema)
                best = min(best, time.perf_counter() - t0)
        finally:
            gc.enable()
        out[name] = best * 1e3
    return out


def measure(per_subset: int, seed: int, repeats: int) -> dict[str, float]:
    """The front door alone: rewrites, llguidance grammar and its check."""
    from radixserve.constrained.schema import llg_spec

    return best_per_schema(per_subset, seed, repeats,
                           lambda schema: llg_spec.llguidance_source.__wrapped__("json", json.dumps(schema), ""))


def measure_request(per_subset: int, seed: int, repeats: int) -> dict[str, float]:
    """A request's whole grammar path: the front door's check (``constraint_of`` as
    request_builder calls it), the scheduler's ``constraint_of`` (unchecked where the tree has
    ``validate``) and the llguidance compile."""
    import inspect

    from radixserve.config import SchedulerConfig
    from radixserve.constrained.schema import llg_spec
    from radixserve.constrained.runtime.registry import make_backend
    from radixserve.constrained.schema.spec import constraint_of
    from radixserve.model.loader import resolve_hf_dir
    from radixserve.sampling_params import SamplingParams
    from radixserve.tokenizer import load_light_tokenizer

    tok = load_light_tokenizer(resolve_hf_dir(None))
    be = make_backend(tok, 49152, (tok.eos_token_id,), SchedulerConfig(json_whitespace_pattern=""))
    unchecked = {"validate": False} if "validate" in inspect.signature(constraint_of).parameters else {}

    def once(schema: dict) -> None:
        sp = SamplingParams(json_schema=schema)
        llg_spec.llguidance_source.cache_clear()
        constraint_of(sp, backend="llguidance")
        be.compile(constraint_of(sp, "", "llguidance", **unchecked).source)

    try:
        return best_per_schema(per_subset, seed, repeats, once)
    finally:
        be.close()


def compare(old: dict[str, float], new: dict[str, float]) -> str:
    both = sorted(set(old) & set(new))
    a, b = np.array([old[k] for k in both]), np.array([new[k] for k in both])
    d = b - a
    return (f"accepted: {len(old)} before, {len(new)} after, {len(both)} both; median {np.median(a):.3f} -> "
            f"{np.median(b):.3f} ms, p99 {np.percentile(a, 99):.2f} -> {np.percentile(b, 99):.2f} ms, all "
            f"{a.sum():.1f} -> {b.sum():.1f} ms; per schema: median {np.median(d) * 1e3:+.1f} us, max "
            f"{d.max():+.2f} ms ({both[int(d.argmax())]})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-subset", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", required=True, help="write {schema: ms} here")
    ap.add_argument("--against", default=None, help="an earlier --out to compare with")
    ap.add_argument("--path", choices=["front-door", "request"], default="front-door",
                    help="front-door: the synchronous check alone; request: check, the scheduler's "
                         "source and the llguidance compile")
    a = ap.parse_args()
    res = (measure if a.path == "front-door" else measure_request)(a.per_subset, a.seed, a.repeats)
    with open(a.out, "w") as f:
        json.dump(res, f)
    print(f"{len(res)} schemas accepted; median {np.median(list(res.values())):.3f} ms")
    if a.against:
        with open(a.against) as f:
            print(compare(json.load(f), res))


if __name__ == "__main__":
    main()
