"""Skeleton of thought: for an MT-Bench-style question, gen a skeleton of four numbered points
(one gen per point, each stopped at the end of its line), then ``fork`` to expand every point in
parallel (gen), then join the expansions into the answer in Python."""
from __future__ import annotations

import random

from benchmarks.programs.data import MT_BENCH
from benchmarks.programs.spec import Workload, scaled, variables
from frontend_lang import function, gen

POINTS = 4
INTRO = (f"You answer questions in two stages. First write a skeleton of exactly {POINTS} numbered points, "
         "each a few words long. Then expand each point on its own into two or three sentences.\n\n")


@function
def skeleton_of_thought(s, question: str, point_tokens: int, expand_tokens: int):
    s += INTRO + f"Question: {question}\nSkeleton:\n"
    for i in range(1, POINTS + 1):
        s += f"{i}." + gen(f"point_{i}", max_tokens=point_tokens, stop="\n") + "\n"
    forks = s.fork(POINTS)
    for i, f in enumerate(forks):
        f += f"\nExpansion of point {i + 1} in two or three sentences:\n{i + 1}."
        f += gen("expansion", max_tokens=expand_tokens)
    expansions = [f["expansion"] for f in forks]
    forks.join()
    points = [s[f"point_{i}"] for i in range(1, POINTS + 1)]
    s += "\nAnswer:\n" + "\n".join(f"{i}.{p}{e}" for i, (p, e) in enumerate(zip(points, expansions), 1))


def make(n: int, seed: int = 0, *, scale: float = 1.0) -> Workload:
    order = random.Random(f"sot-{seed}").sample(MT_BENCH, len(MT_BENCH))
    questions = [order[i % len(order)] for i in range(n)]
    args = [{"question": q, "point_tokens": scaled(16, scale), "expand_tokens": scaled(48, scale)} for q in questions]
    names = [f"point_{i}" for i in range(1, POINTS + 1)] + ["expansion"]
    return Workload("skeleton_of_thought", skeleton_of_thought, args, frozenset({"gen", "stop", "fork"}),
                    variables(*names),
                    description=f"MT-Bench-style question: {POINTS} skeleton points (gen, stop at newline), "
                                "fork to expand each (gen ~48 tokens), joined in Python")
