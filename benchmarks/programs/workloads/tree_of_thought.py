"""Tree of thought: a word problem, ``fork`` into three branches that each propose an approach
(gen) and judge it (``select`` yes/no), then a final answer (gen) over every branch's approach
and verdict.  The problems are generated (``data.word_problems``)."""
from __future__ import annotations

from benchmarks.programs.data import word_problems
from benchmarks.programs.spec import Workload, scaled, variables
from frontend_lang import function, gen, select

INTRO = ("You solve arithmetic word problems carefully. For each problem, several different approaches are "
         "proposed and checked before the final answer is given.\n\n")
STYLES = ["work forwards from the given numbers", "set up an equation first", "estimate, then refine the estimate"]


@function
def tree_of_thought(s, question: str, thought_tokens: int, answer_tokens: int):
    s += INTRO + f"Problem: {question}\n"
    forks = s.fork(len(STYLES))
    for i, f in enumerate(forks):
        f += f"Approach {i + 1} ({STYLES[i]}):" + gen("thought", max_tokens=thought_tokens)
        f += "\nIs this approach correct and complete? Answer yes or no: " + select("verdict", ["yes", "no"])
    thoughts = [f["thought"] for f in forks]
    verdicts = [f["verdict"] for f in forks]
    forks.join()
    s += "".join(f"Approach {i + 1}:{t}\nVerdict: {v}\n" for i, (t, v) in enumerate(zip(thoughts, verdicts)))
    s += "Using the approaches judged correct, the final answer is:" + gen("answer", max_tokens=answer_tokens)


def make(n: int, seed: int = 0, *, scale: float = 1.0) -> Workload:
    args = [{"question": q, "thought_tokens": scaled(48, scale), "answer_tokens": scaled(48, scale)}
            for q in word_problems(n, seed)]
    return Workload("tree_of_thought", tree_of_thought, args, frozenset({"gen", "fork", "select"}),
                    variables("thought", "verdict", "answer"),
                    description="word problem; fork 3 approaches (gen ~48 tokens + yes/no select); final gen")
