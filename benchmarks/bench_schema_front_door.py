"""Per-schema time of the structured-output front door (rewrites, llguidance grammar, validation;
uncached, best of ``--repeats``) on the JSONSchemaBench sample: what a new schema costs before its
compile, to compare two trees of radixserve schema by schema.

Python's garbage collector is paused while a schema is timed (and run before it): a collection
starts wherever the allocation count says, which in a fixed loop is the same schema on every pass,
so it would charge one schema with the whole process's garbage (up to ~1 ms here).

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


def measure(per_subset: int, seed: int, repeats: int) -> dict[str, float]:
    """{schema file: ms} for the schemas the front door accepts."""
    from radixserve.constrained import llg_spec

    items = sample(Data(MIRROR), per_subset, seed)
    out: dict[str, float] = {}
    for _ in range(repeats):
        for _, name, schema in items:
            text = json.dumps(schema)
            gc.collect()
            gc.disable()
            try:
                t0 = time.perf_counter()
                llg_spec.llguidance_source.__wrapped__("json", text, "")
                dt = time.perf_counter() - t0
            except ValueError:
                continue
            finally:
                gc.enable()
            out[name] = min(out.get(name, float("inf")), dt * 1e3)
    return out


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
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", required=True, help="write {schema: ms} here")
    ap.add_argument("--against", default=None, help="an earlier --out to compare with")
    a = ap.parse_args()
    res = measure(a.per_subset, a.seed, a.repeats)
    with open(a.out, "w") as f:
        json.dump(res, f)
    print(f"{len(res)} schemas accepted; median {np.median(list(res.values())):.3f} ms")
    if a.against:
        with open(a.against) as f:
            print(compare(json.load(f), res))


if __name__ == "__main__":
    main()
