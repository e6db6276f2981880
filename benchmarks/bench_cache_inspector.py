"""What one ``/cache/tree`` costs the scheduler on a big tree (the snapshot runs between steps).

Builds a ``RadixCache`` shaped like a chat service (50 system prompts of 200 tokens, each with
thousands of distinct 5-40-token user turns) of ``--nodes`` nodes, then times
``tree_snapshot`` (the scheduler's part) and the server's part (previews + response model
validation + dump) for a few limits.  No model, one thread.

    .venv/bin/python -m benchmarks.bench_cache_inspector --nodes 100000
"""
from __future__ import annotations

import argparse
import random
import time

import numpy as np

from radixserve.mem_cache.radix_cache import RadixCache
from radixserve.mem_cache.tree_inspect import SCAN_BUDGET, tree_snapshot
from radixserve.server.inspector.routes import add_previews
from radixserve.server.inspector.models import CacheTree


def build(num_nodes: int, seed: int = 0) -> RadixCache:
    rnd = random.Random(seed)
    cache, slot = RadixCache(lambda s: None), 1
    systems = [[rnd.randrange(100, 40000) for _ in range(200)] for _ in range(50)]
    while cache.num_nodes < num_nodes:
        key = rnd.choice(systems) + [rnd.randrange(100, 40000) for _ in range(rnd.randrange(5, 40))]
        cache.insert(key, np.arange(slot, slot + len(key)))
        slot += len(key)
    return cache


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    for n in args.nodes:
        cache = build(n)
        print(f"tree: {cache.num_nodes} nodes, {cache.total_size()} tokens (scan budget {SCAN_BUDGET})")
        for max_nodes in (200, 2000):
            times, server = [], []
            for _ in range(args.repeats):
                t = time.perf_counter()
                snap = tree_snapshot(cache, 8, max_nodes, with_tokens=True)
                times.append(time.perf_counter() - t)
                t = time.perf_counter()
                add_previews(snap["root"], lambda ids: " ".join(map(str, ids)), True)
                CacheTree.model_validate({**snap, "text_preview": True}).model_dump(exclude_unset=True)
                server.append(time.perf_counter() - t)
            times.sort(), server.sort()
            print(f"  max_nodes={max_nodes}: snapshot median {1e3 * times[len(times) // 2]:.0f} ms "
                  f"(min {1e3 * times[0]:.0f}, max {1e3 * times[-1]:.0f}), scan_complete={snap['scan_complete']}, "
                  f"returned {snap['returned_nodes']}; server side median {1e3 * server[len(server) // 2]:.0f} ms "
                  f"(max {1e3 * server[-1]:.0f})")


if __name__ == "__main__":
    main()
