"""What a workload of the programs suite is: a ``frontend_lang`` program, the arguments of
each of its runs, and which engine features it needs.

Every workload module of ``benchmarks/programs/workloads/`` has ``make(n, seed) -> Workload``;
``registry.WORKLOADS`` maps a name to that function.  The runner (``run.py``) runs the same
``Workload`` on every engine through a ``frontend_lang`` backend, so a program is written once.

``make`` also takes ``scale`` (keyword, default 1.0, the benchmark's size): it multiplies the
prompt sizes (shots, documents, few-shot examples) and every gen's ``max_tokens`` while the
program's shape (forks, steps, choices) stays; the tests run the suite at a small scale on a
tiny model with a 1024-token context.  ``scaled`` is that rule; ``variables`` builds the usual
``outputs`` function.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol

# the features an engine must have to run a workload (peers without one skip it, saying so)
FEATURES = frozenset({"gen", "select", "fork", "regex", "json_schema", "chat", "stop"})


@dataclass(frozen=True)
class Workload:
    """``n`` runs of one program.

    ``function``: a ``frontend_lang`` ``@function``; ``args``: one keyword dict per run;
    ``features``: subset of ``FEATURES`` it uses; ``outputs(state)``: the values two engines
    must agree on under greedy decoding (generated variables, select decisions), JSON-able;
    ``sampling``: default sampling keywords for every run (temperature 0, token budgets);
    ``expected``: per run, the known right answer of its main select where there is one (for
    an accuracy figure; None otherwise)."""

    name: str
    function: Any
    args: list[dict[str, Any]]
    features: frozenset[str]
    outputs: Callable[[Any], dict[str, Any]]
    sampling: dict[str, Any] = field(default_factory=lambda: {"temperature": 0.0})
    description: str = ""
    expected: Optional[list[Any]] = None

    def __post_init__(self) -> None:
        unknown = self.features - FEATURES
        if unknown:
            raise ValueError(f"{self.name}: unknown features {sorted(unknown)}")


class MakeWorkload(Protocol):
    """``make(n, seed=0, *, scale=1.0)`` of a workload module."""

    def __call__(self, n: int, seed: int = 0, *, scale: float = 1.0) -> Workload: ...


def scaled(size: int, scale: float, least: int = 1) -> int:
    """``size`` (a token budget, a number of shots) at ``scale``, rounded, at least ``least``."""
    return max(least, round(size * scale))


def variables(*names: str) -> Callable[[Any], dict[str, Any]]:
    """An ``outputs`` function: ``{name: state[name]}`` for each name (a gen's text, a select's
    decision; a variable set in fork branches is the list of the branches' values)."""
    def outputs(state: Any) -> dict[str, Any]:
        return {name: state[name] for name in names}

    return outputs
