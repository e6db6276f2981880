"""Helpers of the speculative-decoding tests (test_speculative*.py)."""
from __future__ import annotations

from tests.helpers.models import hf_greedy


def spec_counts(outs: list[dict]) -> tuple[int, int]:
    """(proposed, accepted) speculative tokens over results' ``meta_info``."""
    return (sum(o["meta_info"]["spec_proposed_tokens"] for o in outs),
            sum(o["meta_info"]["spec_accepted_tokens"] for o in outs))


def greedy_three_ways(eng, plain, hf_model, prompts: list[list[int]], n: int) -> tuple[list, list, list, list[dict]]:
    """Greedy outputs of ``n`` tokens: with speculation (``eng``), without (``plain``), from HF;
    and ``eng``'s results."""
    sp = {"max_new_tokens": n, "temperature": 0}
    outs = eng.generate(input_ids=prompts, sampling_params=sp)
    ref = plain.generate(input_ids=prompts, sampling_params=sp)
    return ([o["output_ids"] for o in outs], [r["output_ids"] for r in ref],
            [hf_greedy(hf_model, p, n) for p in prompts], outs)
