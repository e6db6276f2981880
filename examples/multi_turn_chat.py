"""Multi-turn chat: each turn appends to the conversation, so each request reuses the
KV cache of every earlier turn (``cached_tokens`` grows turn by turn).

Roles are rendered with the model's own chat template; ``with s.user():`` is the
context-manager form of ``s += user(...)``.  ``--stream`` prints the last reply token by
token with ``text_iter``.

    radixserve serve &
    python examples/multi_turn_chat.py  # [--url http://127.0.0.1:30000] [--stream]
"""
from __future__ import annotations

import argparse

from frontend_lang import RuntimeEndpoint, assistant, function, gen, set_default_backend, system

TURNS = [
    "Hi! I'm planning a weekend trip to Lisbon. What should I see first?",
    "Great. Which neighbourhood is best for dinner?",
    "And how do I get there from the airport?",
]


@function
def chat(s, turns: list[str]):
    s += system("You are a friendly travel assistant. Keep every answer to two sentences.")
    for i, question in enumerate(turns):
        with s.user():
            s += question
        s += assistant(gen(f"answer_{i}", max_tokens=64))


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:30000")
    ap.add_argument("--stream", action="store_true", help="stream the replies as they are generated")
    args = ap.parse_args(argv)
    set_default_backend(RuntimeEndpoint(args.url))
    state = chat.run(turns=TURNS, temperature=0, stream=args.stream)
    if args.stream:
        for i in range(len(TURNS)):
            print(f"[assistant {i}] ", end="", flush=True)
            for chunk in state.text_iter(f"answer_{i}"):
                print(chunk, end="", flush=True)
            print()
    for i in range(len(TURNS)):
        meta = state.get_meta_info(f"answer_{i}")
        print(f"turn {i}: cached {meta['cached_tokens']} of {meta['prompt_tokens']} prompt tokens")
    for m in state.messages():
        print(f"{m['role']:>9}: {m['content']}")
    return state.messages()


if __name__ == "__main__":
    main()
