"""A quantized path stops being timed past the first row count where it is slower than every
kernel of the dense dtype it competes with (``numerics_choice.ceilings``, ``kernel_timing.time_path``):
the Ms it skips are never read by the choice, so cut tables give the same candidates as full ones
under every pin.  Random tables and fake timers: nothing here depends on this machine's speed."""
from __future__ import annotations

import json
import random

from radixserve.model.quant.linear import METHODS
from radixserve.worker.tuning.kernel_timing import CUT, DENSE, INT4_F32, PACKED, cache_key, measured_timings, \
    time_path
from radixserve.worker.tuning.numerics_choice import candidates, ceilings, wins_up_to

MS = (1, 2, 4, 8, 16, 64, 256, 1024)
ALL = DENSE + tuple(d + PACKED for d in DENSE) + METHODS + (INT4_F32,)


def random_table(rng: random.Random) -> dict[str, dict[int, float]]:
    """Per path a cost per call that grows with M (a fixed part and a per-row part), jittered."""
    out = {}
    for p in ALL:
        fixed, per_row = rng.uniform(0.2, 3.0), rng.uniform(0.005, 0.05) * rng.choice((0.3, 1, 3))
        out[p] = {m: (fixed + per_row * m) * rng.uniform(0.85, 1.15) for m in MS}
    return out


def cut(per_m: dict[int, float], ceiling: dict[int, float]) -> dict[int, float]:
    out, lost = {}, False
    for m in MS:
        out[m] = CUT if lost else per_m[m]
        lost = lost or per_m[m] > ceiling[m]
    return out


def test_cut_tables_give_the_same_choice_under_every_pin():
    rng = random.Random(0)
    cuts = 0
    for _ in range(3000):
        t = random_table(rng)
        limits = ceilings(t, METHODS + (INT4_F32,))
        c = {p: cut(t[p], limits[p]) if p in limits else t[p] for p in t}
        cuts += sum(CUT in v.values() for v in c.values())
        for pin in ("auto", "plain", "packed"):
            assert candidates(c, pin) == candidates(t, pin)
        for dense in ("float32", "float32" + PACKED):  # --dtype float32 --quantization int4, either kernel
            assert wins_up_to(c[INT4_F32], t[dense]) == wins_up_to(t[INT4_F32], t[dense])
    assert cuts > 1000  # (the tables do exercise the cut)


def test_the_real_timer_stops_past_a_confirmed_loss():
    shapes = ((32, 16), (24, 16))
    got = time_path("float32", shapes, ms=(1, 3, 5), reps=1, ceiling={1: 0.0, 3: 0.0, 5: 0.0})
    assert got[1] > 0 and got[3] == CUT and got[5] == CUT
    got = time_path("float32", shapes, ms=(1, 3, 5), reps=1, ceiling={1: 1e9, 3: 1e9, 5: 1e9})
    assert all(0 < v < CUT for v in got.values())


def test_a_cut_table_is_cached_and_read_back(tmp_path):
    path = str(tmp_path / "kernel_timings.json")
    shapes, ms = ((8, 16),), (1, 4, 16)
    seen = []

    def timer(p, shapes, ms, ceiling=None):
        seen.append(ceiling)
        return {1: 1e-4, 4: 3e-4, 16: CUT}

    got, _ = measured_timings(shapes, ("int8",), path, timer, ms, ceilings={"int8": {1: 1.0, 4: 2e-4, 16: 1.0}})
    assert got == {"int8": {1: 1e-4, 4: 3e-4, 16: CUT}} and seen == [{1: 1.0, 4: 2e-4, 16: 1.0}]
    assert json.load(open(path))[cache_key(shapes, ms)]["timings"]["int8"]["16"] is None
    assert measured_timings(shapes, ("int8",), path, timer, ms) == (got, True) and len(seen) == 1
