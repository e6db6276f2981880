"""``WORKLOADS``: every workload of the programs suite by name, in the suite's order; each value
is its module's ``make(n, seed=0, *, scale=1.0)``."""
from __future__ import annotations

from benchmarks.programs.spec import MakeWorkload
from benchmarks.programs.workloads import (branch_solve_merge, hellaswag, json_regex, json_schema, mmlu,
                                           multi_turn_long, multi_turn_short, rag_pipeline, react_agent,
                                           skeleton_of_thought, tree_of_thought)

WORKLOADS: dict[str, MakeWorkload] = {
    "mmlu": mmlu.make,
    "hellaswag": hellaswag.make,
    "tree_of_thought": tree_of_thought.make,
    "branch_solve_merge": branch_solve_merge.make,
    "skeleton_of_thought": skeleton_of_thought.make,
    "react_agent": react_agent.make,
    "json_regex": json_regex.make,
    "json_schema": json_schema.make,
    "multi_turn_short": multi_turn_short.make,
    "multi_turn_long": multi_turn_long.make,
    "rag_pipeline": rag_pipeline.make,
}
