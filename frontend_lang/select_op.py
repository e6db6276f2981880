"""``select``: score each choice by its token logprobs after the prefix, then pick one.

Steps (identical on every backend): tokenize the prefix and every prefix+choice in one
call; for each choice find the first position where its ids differ from the prefix's (the
tokenizer may merge across the junction, so the choice's tokens start there, possibly
inside the prefix's last token); send the prefix once as a prefix hint (max_new_tokens 0);
then one batched prefill of all prefix+choice prompts with ``return_logprob`` and
``logprob_start_len`` = the earliest divergence, so only the last few prefix positions and
the choice tokens go through the LM head.  The method in choice_scoring.py decides.
"""
from __future__ import annotations

from typing import Any, Optional

from frontend_lang.backend.base import Backend, lora_kw
from frontend_lang.choice_scoring import ChoicesSamplingMethod, mean
from frontend_lang.errors import ProgramError


def divergence(prefix_ids: list[int], ids: list[int]) -> int:
    """First index where ``ids`` differs from ``prefix_ids``, at most len(ids) - 1."""
    n = min(len(prefix_ids), len(ids))
    i = 0
    while i < n and prefix_ids[i] == ids[i]:
        i += 1
    return min(i, len(ids) - 1)


def _scored(rows: list[list[tuple]], starts: list[int], base: int) -> list[list[tuple[float, int]]]:
    return [[(lp, tid) for lp, tid in row[s - base:] if lp is not None] for row, s in zip(rows, starts)]


def choice_logprobs(backend: Backend, prefix: str, choices: list[str], priority: Optional[int] = None,
                    lora: Optional[str] = None) -> tuple[list[list[tuple[float, int]]], dict]:
    """(per choice, the (logprob, token id) of its tokens given ``prefix``; details)."""
    all_ids = backend.tokenize([prefix, *[prefix + c for c in choices]])
    prefix_ids, choice_ids = all_ids[0], all_ids[1:]
    starts = [divergence(prefix_ids, ids) for ids in choice_ids]
    if min(starts) == 0:  # a choice's first token would be the prompt's first: nothing conditions it
        raise ProgramError("select: there is no text before the choices to score them against")
    if prefix_ids:
        backend.cache_prefix(input_ids=prefix_ids, priority=priority, **lora_kw(lora))
    base = min(starts)
    rows = backend.prompt_logprobs(choice_ids, base, priority, **lora_kw(lora))
    return _scored(rows, starts, base), {"prefix_tokens": len(prefix_ids), "logprob_start_len": base,
                                         "choice_starts": starts}


def unconditional_logprobs(backend: Backend, choices: list[str], priority: Optional[int] = None,
                           lora: Optional[str] = None) -> list[list[tuple[float, int]]]:
    """Token logprobs of each choice on its own (its first token has none)."""
    ids = backend.tokenize(list(choices))
    rows = backend.prompt_logprobs(ids, 0, priority, **lora_kw(lora))
    return _scored(rows, [0] * len(ids), 0)


def run_select(backend: Backend, prefix: str, choices: list[str], method: ChoicesSamplingMethod,
               priority: Optional[int] = None, lora: Optional[str] = None) -> tuple[int, dict[str, Any]]:
    """(index of the chosen choice, meta_info with the decision and every choice's scores);
    every request it sends carries ``priority`` (None: the server's default) and the LoRA
    adapter ``lora`` (None: the base model)."""
    cond, details = choice_logprobs(backend, prefix, choices, priority, lora)
    uncond = unconditional_logprobs(backend, choices, priority, lora) if method.needs_unconditional else None
    values = [[lp for lp, _ in c] for c in cond]
    index, scores = method(values, None if uncond is None else [[lp for lp, _ in u] for u in uncond])
    meta = {
        "choices": list(choices), "decision": choices[index], "decision_index": index, "method": method.name,
        "scores": scores,
        "normalized_prompt_logprobs": [mean(v) for v in values],
        "sum_prompt_logprobs": [sum(v) for v in values],
        "input_token_logprobs": cond,
        "unconditional_token_logprobs": uncond,
        **details,
    }
    return index, meta
