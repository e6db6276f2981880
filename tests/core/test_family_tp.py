"""Tensor parallelism per model family (tests/helpers/families.py), on the CPU over gloo.

For every family in ``FAMILIES`` (parametrized at collection, so a family added there is
covered here; Llama is test_tp.py's, and Mistral's window and Gemma 2's soft-caps are attention
options TP does not touch, which Gemma 3 covers): a rank's model is first built in this process with rank 0's ``TPLayout`` of
two ranks (weights sliced as a rank loads them).  A family that builds is served with
``tp_size=2`` and must give tp=1's greedy tokens, with every prompt/output logprob within
1e-4 (``tp_compare.assert_same``, test_tp.py's oracle; tp=1 itself is checked against
transformers in test_families.py).  A family that cannot be split must say so with a
ValueError naming tensor parallelism, be one with experts or latent attention (a dense
family must split), and the Engine must then refuse to start.
"""
from __future__ import annotations

import re
from typing import Any, Optional

import pytest
import torch

from tests.helpers.families import FAMILIES, WINDOW, build_family
from tests.helpers.models import make_engine
from tests.helpers.tp_compare import assert_same

GEN = {"max_new_tokens": 12, "temperature": 0}
TP_WORDS = re.compile(r"tensor.parallel|tp_size", re.IGNORECASE)
SPLITLESS = ("num_experts", "num_local_experts", "n_routed_experts", "kv_lora_rank")  # MoE, MLA


def _rank0_model_error(path: str) -> Optional[ValueError]:
    """Build rank 0 of 2 here (no process group: collectives are identities); the ValueError
    the family raises for it, None when it builds."""
    from radixserve.model import loader
    from radixserve.parallel.group import NoTP
    from radixserve.parallel.layout import TPLayout

    cfg = loader.load_config(path)
    try:
        loader.load_model(cfg, path, torch.float32, torch.device("cpu"), 256, tp=NoTP(),
                          layout=TPLayout.of(cfg, 0, 2))
    except ValueError as e:
        return e
    return None


def _splitless(cfg: Any) -> bool:
    return any(getattr(cfg, k, None) for k in SPLITLESS)


def _run(eng, prompts: list[list[int]]) -> list[dict]:
    """The last prompt after the others, with logprobs past its cached prefix only."""
    kw = dict(sampling_params=GEN, return_logprob=True, top_logprobs_num=3)
    return (eng.generate(input_ids=prompts[:-1], logprob_start_len=0, **kw)
            + eng.generate(input_ids=prompts[-1:], logprob_start_len=3 * WINDOW, **kw))


# Llama is test_tp.py's; Mistral's window and Gemma 2's soft-caps are per-layer attention options
# that TP does not touch (Gemma 3 covers Gemma's layers and a window under TP)
@pytest.mark.parametrize("name", sorted(set(FAMILIES) - {"llama", "mistral-window", "gemma2"}))
def test_family_tp2_matches_tp1_or_refuses_naming_tp(name, tmp_path, smol_dir):
    from radixserve.model import loader

    path = str(tmp_path)
    build_family(name, path, smol_dir)
    refusal = _rank0_model_error(path)
    if refusal is not None:
        assert _splitless(loader.load_config(path)), f"{name}: a dense family must split over 2 ranks: {refusal}"
        assert TP_WORDS.search(str(refusal)), f"{name}: the refusal must name tensor parallelism: {refusal}"
        with pytest.raises((ValueError, RuntimeError)):  # a rank's ValueError ends its start (ChildDied)
            make_engine(path, quantization="none", tp_size=2).shutdown()
        return
    # longer than the window; the third shares the second's prefix (a radix-cache hit under TP)
    prompts = [list(range(300, 305)), list(range(400, 400 + 3 * WINDOW + 5)),
               list(range(400, 400 + 3 * WINDOW)) + [900, 901, 902]]
    with make_engine(path, quantization="none", max_total_tokens=1024) as eng:
        ref = _run(eng, prompts)
    with make_engine(path, quantization="none", max_total_tokens=1024, tp_size=2, chunked_prefill_size=32) as eng:
        got = _run(eng, prompts)
        assert got[2]["meta_info"]["cached_tokens"] >= 3 * WINDOW - 1
        eng.check_invariants()
    assert_same(ref, got)
    assert len({tuple(o["output_ids"]) for o in ref}) > 1, name  # not a degenerate model
