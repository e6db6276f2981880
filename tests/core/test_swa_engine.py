"""A Gemma 3 (5 sliding layers of ``WINDOW`` tokens per full one) served with its sliding layers
in a pool much smaller than its prompts (``mem_cache/swa_slots.py``): transformers' greedy
tokens in fp32 on prompts of 3-12 windows that share a long prefix, from a cold cache, from the
radix cache (prefixes whose sliding KV was reclaimed are cut and recomputed), under retraction,
on the native CPU backend (its C++ layer stack included) and on torch_native; the invariants of
both pools hold after each scenario.  ``disable_hybrid_swa_memory`` gives one pool."""
from __future__ import annotations

import pytest

from tests.helpers.families import WINDOW, build_family
from tests.helpers.models import hf_greedy, make_engine

GEN = {"max_new_tokens": 10, "temperature": 0}
SHARED = list(range(400, 400 + 5 * WINDOW))  # a 120-token shared "system prompt"


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory, smol_dir):
    path = str(tmp_path_factory.mktemp("gemma3_swa"))
    hf = build_family("gemma3", path, smol_dir)
    prompts = [SHARED + list(range(900 + 50 * i, 900 + 50 * i + n)) for i, n in enumerate((30, 2 * WINDOW, 170))]
    prompts.append(list(range(2000, 2000 + 3 * WINDOW)))
    return path, prompts, [hf_greedy(hf, p, GEN["max_new_tokens"]) for p in prompts]


@pytest.mark.parametrize("backend", ["cpu", "torch_native"])
def test_gemma3_in_a_small_sliding_pool_keeps_transformers_tokens(gemma3, backend):
    path, prompts, ref = gemma3
    eng = make_engine(path, max_total_tokens=1400, chunked_prefill_size=32, swa_full_tokens_ratio=0.05,
                      attention_backend=backend)
    kv = eng.stats()
    sliding = kv["sliding_num_slots"]
    assert sliding < max(len(p) for p in prompts) < kv["num_slots"], kv
    for _ in range(2):  # cold, then from the cache
        out = eng.generate(input_ids=prompts, sampling_params=GEN)
        assert [o["output_ids"] for o in out] == ref
        eng.check_invariants()
    assert sum(o["meta_info"]["cached_tokens"] for o in out) >= len(SHARED), "the shared prefix was reused"
    one = eng.generate(input_ids=prompts[2], sampling_params=GEN)
    assert one["output_ids"] == ref[2]
    eng.check_invariants()
    eng.shutdown()


def test_retraction_and_a_single_pool(gemma3):
    path, prompts, ref = gemma3
    eng = make_engine(path, max_total_tokens=420, chunked_prefill_size=32, swa_full_tokens_ratio=0.3,
                      new_token_ratio=0.05)
    out = eng.generate(input_ids=prompts * 2, sampling_params=GEN)
    assert [o["output_ids"] for o in out] == ref * 2
    assert eng.stats()["retractions"] > 0 and "sliding_num_slots" in eng.stats()
    eng.check_invariants()
    eng.shutdown()
    eng = make_engine(path, max_total_tokens=1400, disable_hybrid_swa_memory=True)
    assert "sliding_num_slots" not in eng.stats()
    assert [o["output_ids"] for o in eng.generate(input_ids=prompts, sampling_params=GEN)] == ref
    eng.shutdown()
