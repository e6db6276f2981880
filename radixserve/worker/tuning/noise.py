"""When is a timing plainly noisy?  The rule ``kernel_timing`` and ``attention_timing`` apply
before they cache a table, so that a choice made on a busy minute is not kept for good.

A table of times by size (rows M of a linear call, query tokens of an attention block) is
noisy when either holds:

1. **Not monotone.**  A call on more rows never takes less time, give or take ``SLACK``: a time
   at a smaller size above ``SLACK`` times the smallest time at any larger size is an outlier
   (seen on a busy 2-core VM: fp32 at 2 rows 14.5 ms against 1.4 ms at 8; 60 ms on a 64-wide
   shape that takes 0.1 ms).  Real kernels are not perfectly monotone (oneDNN's fp32 GEMM took
   1.3x longer at 4 rows than at 8 on an AMD EPYC, every time), hence the slack.
2. **Taken on a busy machine.**  While it was taken, other processes used more than
   ``LOAD_MAX`` of a core beyond the cores this process leaves free (``/proc/stat``'s busy and
   steal time of the CPUs this process may run on, less this process's own CPU time), so
   torch's threads were preempted.  Judged only over windows of at least ``MIN_WINDOW_S``
   (``/proc/stat`` counts in 10 ms jiffies); shorter ones, and machines without ``/proc/stat``,
   count as quiet.

A noisy table is retaken (``MAX_TAKES`` takes in all, a retake only while the caller's
``Budget`` of seconds covers it; after ``BUSY_TAKES`` takes in a row on a busy machine the load
is taken to last: no more retakes, and ``kernel_timing`` times what is left in one quick pass
per path, until a take finds the machine quiet) and the takes merge by their minimum at each size: noise only
ever adds time.  A table still noisy after that is never cached as a clean one: this start uses it, with
a warning that names why, and it is kept as *provisional*.  A later start uses a provisional table while
the machine is still busy (``quiet_now``: other processes' CPU over half a second of sleep), so a
machine that is always busy does not pay the timing again at every start, and retakes it on the first
start that finds the machine quiet.
"""
from __future__ import annotations

import logging
import os
import resource
import time
from typing import Callable, Optional, TypeVar

logger = logging.getLogger(__name__)

SLACK = 1.5  # a time may exceed the smallest at any larger size by this factor
LOAD_MAX = 0.25  # cores other processes may use beyond those this one leaves free
MIN_WINDOW_S = 0.5  # shorter windows are not judged for load
MAX_TAKES = 3  # takes of one table, the first included
BUSY_TAKES = 2  # this many takes in a row on a busy machine: the load lasts
T = TypeVar("T")


class Budget:
    """Seconds that retakes may spend in all (over every table of one measurement): a retake
    starts only while what is left covers the last take's time."""

    def __init__(self, seconds: float) -> None:
        self.left = seconds

    def spend(self, seconds: float) -> None:
        self.left -= seconds


_busy_takes = [0]  # consecutive takes of this process that found the machine busy


def machine_busy() -> bool:
    """Whether the last ``BUSY_TAKES`` takes all ran on a busy machine: the load lasts, so no
    retake would help, and a table timed now will not be cached anyway."""
    return _busy_takes[0] >= BUSY_TAKES


def reset() -> None:
    """Forget the machine's load (tests)."""
    _busy_takes[0] = 0


def _cpu_ticks() -> Optional[int]:
    """Busy jiffies (user, nice, system, irq, softirq, steal) of the CPUs this process may use."""
    try:
        allowed = os.sched_getaffinity(0)
        with open("/proc/stat") as f:
            lines = f.read().splitlines()
    except (OSError, AttributeError):
        return None
    busy = 0
    for line in lines:
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in allowed:
            continue
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
        busy += user + nice + system + irq + softirq + steal
    return busy


def _own_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class LoadProbe:
    """Cores that other processes used while it ran (``others``; None when not judged)."""

    def __init__(self, threads: int) -> None:
        try:
            cpus = len(os.sched_getaffinity(0))
        except AttributeError:
            cpus = os.cpu_count() or 1
        self.spare = max(0, cpus - threads)  # cores this process leaves free
        self.others: Optional[float] = None

    def __enter__(self) -> "LoadProbe":
        self._t, self._own, self._ticks = time.monotonic(), _own_cpu_s(), _cpu_ticks()
        return self

    def __exit__(self, *exc: object) -> None:
        wall, ticks = time.monotonic() - self._t, _cpu_ticks()
        if self._ticks is None or ticks is None or wall < MIN_WINDOW_S:
            return
        busy = (ticks - self._ticks) / os.sysconf("SC_CLK_TCK")
        self.others = max(0.0, busy - (_own_cpu_s() - self._own)) / wall

    def busy(self) -> bool:
        return self.others is not None and self.others > self.spare + LOAD_MAX


def quiet_now(threads: int, seconds: float = MIN_WINDOW_S) -> bool:
    """Whether other processes leave this process's cores free now (judged over ``seconds`` of
    sleep; a machine that cannot be judged counts as quiet)."""
    with LoadProbe(threads) as probe:
        time.sleep(seconds)
    return not probe.busy()


def outliers(per_size: dict[int, float], slack: float = SLACK) -> list[str]:
    """The sizes whose time breaks the monotone rule, described ("2 rows: 14547 us, 10.6x 8 rows")."""
    sizes = sorted(per_size)
    out = []
    for i, s in enumerate(sizes[:-1]):
        larger = min(sizes[i + 1:], key=lambda m: per_size[m])
        if per_size[s] > slack * per_size[larger]:
            out.append(f"{s}: {per_size[s] * 1e6:.0f} us, {per_size[s] / per_size[larger]:.1f}x {larger}")
    return out


def merge_min(a: dict[int, float], b: dict[int, float]) -> dict[int, float]:
    return {k: min(a[k], b[k]) if k in b else a[k] for k in a}


def settle(label: str, take: Callable[[], T], problems: Callable[[T], list[str]], merge: Callable[[T, T], T],
           threads: int, budget: Budget) -> tuple[T, list[str], int]:
    """(table, what is still noisy about it, takes): ``take()`` once, then again while the merged
    table has ``problems`` or the last take ran on a busy machine, up to ``MAX_TAKES``, while
    ``budget`` covers another take and unless the machine stays busy (see the module docstring).
    Each retake logs one line naming ``label``."""
    table: Optional[T] = None
    why: list[str] = []
    takes, last = 0, 0.0
    while takes == 0 or (why and takes < MAX_TAKES and budget.left >= last and not machine_busy()):
        if takes:
            logger.info("%s: noisy (%s); retaking it", label, "; ".join(why))
        t0 = time.monotonic()
        with LoadProbe(threads) as probe:
            got = take()
        last = time.monotonic() - t0
        if takes:
            budget.spend(last)
        takes += 1
        table = got if table is None else merge(table, got)
        why = problems(table)
        if probe.busy():
            why.append(f"other processes used {probe.others:.2f} cores while it was timed")
            _busy_takes[0] += 1
            if _busy_takes[0] == BUSY_TAKES:
                logger.info("%s: the machine stays busy; no more retakes, and what is left is timed once, quickly "
                            "(none of it is cached)", label)
        elif probe.others is not None:
            _busy_takes[0] = 0
    assert table is not None
    return table, why, takes
