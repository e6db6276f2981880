"""Fork and judge: draft several answers in parallel, then let the model pick the best.

``s.fork(n)`` commits the shared prompt once (a prefix hint) and runs the branches
concurrently; the judge sees every draft and chooses one with ``select``.

    radixserve serve &
    python examples/fork_and_judge.py   # [--url http://127.0.0.1:30000] [--drafts 3]
"""
from __future__ import annotations

import argparse

from frontend_lang import RuntimeEndpoint, assistant, function, gen, select, set_default_backend, system, user


@function
def fork_and_judge(s, question: str, drafts: int):
    s += system("You are a careful assistant who answers in one or two sentences.")
    s += user(question)
    forks = s.fork(drafts)
    for i, f in enumerate(forks):
        # a different seed per branch gives different drafts at temperature > 0
        f += assistant(gen("draft", max_tokens=48, temperature=0.8, seed=1000 + i))
    forks.join()  # waits for every branch; s["draft"] is now the list of the drafts
    candidates = s["draft"]

    s += user("Here are candidate answers:\n"
              + "\n".join(f"({i + 1}) {c.strip()}" for i, c in enumerate(candidates))
              + "\nWhich candidate is the most accurate and helpful? Reply with its number.")
    s += assistant("The best candidate is (" + select("best", choices=[str(i + 1) for i in range(drafts)]) + ")")


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:30000")
    ap.add_argument("--drafts", type=int, default=3)
    ap.add_argument("--question", default="Why is the sky blue?")
    args = ap.parse_args(argv)
    set_default_backend(RuntimeEndpoint(args.url))
    state = fork_and_judge.run(question=args.question, drafts=args.drafts)
    print(state.text())
    scores = ", ".join(f"{x:.2f}" for x in state.get_meta_info("best")["normalized_prompt_logprobs"])
    print(f"\njudge picked draft {state['best']} (normalized logprobs {scores})")
    return state["best"]


if __name__ == "__main__":
    main()
