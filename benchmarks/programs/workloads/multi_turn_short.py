"""Multi-turn chat with short replies: a system prompt, then four user turns (ShareGPT human
turns cut to 40 words), each answered by a 16-token reply (gen, ``ignore_eos`` so every engine
decodes the same number of tokens).  The chat template renders the roles; every turn extends
the previous one's context.  ``multi_turn_long`` runs the same program with 128-token replies."""
from __future__ import annotations

from benchmarks.programs.data import sharegpt_turns
from benchmarks.programs.spec import Workload, scaled, variables
from frontend_lang import assistant, function, gen, system, user

TURNS = 4
SYSTEM = "You are a helpful assistant. Answer the user's messages directly and concisely."


@function
def multi_turn(s, turns: list[str], reply_tokens: int):
    s += system(SYSTEM)
    for i, q in enumerate(turns, 1):
        s += user(q)
        s += assistant(gen(f"reply_{i}", max_tokens=reply_tokens, ignore_eos=True))


def make_chat(name: str, n: int, seed: int, scale: float, reply_tokens: int) -> Workload:
    texts = sharegpt_turns(TURNS * n, f"{name}-{seed}", words=scaled(40, scale, least=4))
    args = [{"turns": texts[i * TURNS:(i + 1) * TURNS], "reply_tokens": scaled(reply_tokens, scale)}
            for i in range(n)]
    return Workload(name, multi_turn, args, frozenset({"chat", "gen"}),
                    variables(*(f"reply_{i}" for i in range(1, TURNS + 1))),
                    description=f"{TURNS}-turn chat (ShareGPT user turns), {reply_tokens}-token replies")


def make(n: int, seed: int = 0, *, scale: float = 1.0) -> Workload:
    return make_chat("multi_turn_short", n, seed, scale, 16)
