"""Branch-solve-merge LLM judge: a question and an answer to judge (a ShareGPT human turn and its
reply), ``fork`` into four criteria branches that each write a short judgment (gen), then merge:
a final verdict (gen) over the branches' judgments."""
from __future__ import annotations

from benchmarks.programs.data import sharegpt_qa
from benchmarks.programs.spec import Workload, scaled, variables
from frontend_lang import function, gen

SYSTEM = ("You are an impartial judge of answers written by an AI assistant. Read the user's question and "
          "the assistant's answer, judge the answer on the criterion you are asked about, and be brief.\n\n")
CRITERIA = [
    ("helpfulness", "Does the answer address what the user actually asked, and is it useful?"),
    ("correctness", "Are the facts, steps and claims in the answer accurate?"),
    ("clarity", "Is the answer well organised and easy to follow?"),
    ("completeness", "Does the answer cover every part of the question without padding?"),
]


@function
def branch_solve_merge(s, question: str, answer: str, judgment_tokens: int, verdict_tokens: int):
    s += SYSTEM + f"[Question]\n{question}\n\n[Answer]\n{answer}\n\n"
    forks = s.fork(len(CRITERIA))
    for f, (name, ask) in zip(forks, CRITERIA):
        f += f"[Criterion: {name}] {ask}\nJudgment:" + gen("judgment", max_tokens=judgment_tokens)
    judgments = [f["judgment"] for f in forks]
    forks.join()
    s += "[Judgments]\n" + "".join(f"- {name}:{j}\n" for (name, _), j in zip(CRITERIA, judgments))
    s += "[Final verdict] Weighing the judgments above, the overall score from 1 to 10 and the reason:"
    s += gen("verdict", max_tokens=verdict_tokens)


def make(n: int, seed: int = 0, *, scale: float = 1.0) -> Workload:
    words = scaled(150, scale, least=8)
    args = [{"question": q, "answer": " ".join(a.split(" ")[:words]), "judgment_tokens": scaled(48, scale),
             "verdict_tokens": scaled(48, scale)} for q, a in sharegpt_qa(n, seed)]
    return Workload("branch_solve_merge", branch_solve_merge, args, frozenset({"gen", "fork"}),
                    variables("judgment", "verdict"),
                    description="LLM judge over a ShareGPT answer: fork 4 criteria (gen ~48 tokens), merge verdict")
