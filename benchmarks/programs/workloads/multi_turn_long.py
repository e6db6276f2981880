"""Multi-turn chat with long replies: ``multi_turn_short``'s program and turns, 128-token replies."""
from __future__ import annotations

from benchmarks.programs.spec import Workload
from benchmarks.programs.workloads.multi_turn_short import make_chat


def make(n: int, seed: int = 0, *, scale: float = 1.0) -> Workload:
    return make_chat("multi_turn_long", n, seed, scale, 128)
