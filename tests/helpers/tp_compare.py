"""The tensor-parallel oracle: a tp>1 run against tp=1's results (``Engine.generate`` dicts
with ``return_logprob``, ``logprob_start_len=0`` and ``top_logprobs_num``)."""
from __future__ import annotations

ATOL = 1e-4


def assert_same(ref: list[dict], got: list[dict], atol: float = ATOL) -> None:
    """Identical greedy tokens; every prompt/output logprob and top-k alternative within ``atol``."""
    for r, g in zip(ref, got, strict=True):
        assert g["output_ids"] == r["output_ids"]
        for key in ("input_token_logprobs", "output_token_logprobs"):
            a, b = r["meta_info"][key], g["meta_info"][key]
            assert [t[1] for t in a] == [t[1] for t in b]
            diff = [abs(x[0] - y[0]) for x, y in zip(a, b) if x[0] is not None]
            assert diff and max(diff) < atol, (key, max(diff))
        for x, y in zip(r["meta_info"]["output_top_logprobs"], g["meta_info"]["output_top_logprobs"]):
            assert [t[1] for t in x] == [t[1] for t in y]
            assert max(abs(p[0] - q[0]) for p, q in zip(x, y)) < atol
