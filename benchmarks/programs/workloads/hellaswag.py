"""HellaSwag-style 20-shot completion: twenty solved contexts (the shared prefix), then a
context and a ``select`` over four multi-token endings.

Items come from ShareGPT text (``data.hellaswag_items``; HellaSwag itself needs the hub): a
context is a human turn's first 40 words, the right ending its next 16, the wrong ones the
same span of other turns.
"""
from __future__ import annotations

from benchmarks.programs.data import hellaswag_items
from benchmarks.programs.spec import Workload, scaled, variables
from frontend_lang import function, select

SHOTS = 20


@function
def hellaswag(s, shots: str, context: str, endings: list[str]):
    s += shots + context
    s += select("answer", choices=endings)


def make(n: int, seed: int = 0, *, scale: float = 1.0) -> Workload:
    k = scaled(SHOTS, scale)
    pool = hellaswag_items(SHOTS + n, seed)
    shots = "".join(it["context"] + it["endings"][it["label"]] + "\n\n" for it in pool[:k])
    items = pool[SHOTS:]
    args = [{"shots": shots, "context": it["context"], "endings": it["endings"]} for it in items]
    return Workload("hellaswag", hellaswag, args, frozenset({"select"}), variables("answer"),
                    description=f"{SHOTS}-shot completion from ShareGPT text; select over 4 endings",
                    expected=[it["endings"][it["label"]] for it in items])
