"""A quantized KV pool (``--kv-cache-dtype``) through the in-process Engine (tiny model): a prefix
read back from the pool, the host tier, the disk tier or a warm-restart file gives the same greedy
output as computing it (the attention always reads the packed rows, the new tokens' too), on the
native kernel and on torch_native, with chunked prefill and cache salts; the pool holds more
tokens in the same memory; combinations that cannot work are refused naming the field."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from radixserve.config import CacheConfig, SchedulerConfig
from radixserve.worker.kv_sizing import kv_layout
from tests.core.test_hicache_engine import DOC, GREEDY, PROMPTS, hits, tiered
from tests.helpers.models import make_engine


def outputs(eng, order, **params) -> dict[int, list[int]]:
    out = {}
    for i in order:
        o = eng.generate(input_ids=PROMPTS[i], sampling_params={**GREEDY, **params})
        out.setdefault(i, o["output_ids"])
        assert o["output_ids"] == out[i], f"prompt {i} changed when its prefix came back"
        eng.check_invariants()
    return out


@pytest.mark.parametrize("kind,backend", [("int8", "cpu"), ("fp8_e4m3", "cpu"), ("fp8_e5m2", "torch_native")])
def test_prefix_from_every_tier_equals_computing_it(tiny_dir, tmp_path, kind, backend):
    fresh = make_engine(tiny_dir, kv_cache_dtype=kind, attention_backend=backend, disable_radix_cache=True)
    want = outputs(fresh, range(8))
    fresh.shutdown()
    eng = tiered(tiny_dir, tmp_path, kv_cache_dtype=kind, attention_backend=backend)
    assert eng.runner.kv_pool.quant == kind and eng.runner.kv_pool.k_buffer[0].dtype == torch.uint8
    # 0-2 computed; 0 again from the pool or host tier; 3-7 push 1 to disk; then 1 from disk
    got = outputs(eng, (0, 1, 2, 0, 3, 4, 5, 6, 7, 1, 2))
    assert got == want
    host, disk = hits(eng)
    assert host >= DOC - 1 and disk >= DOC - 1
    eng.shutdown()


def test_chunked_prefill_and_salts(tiny_dir):
    whole = make_engine(tiny_dir, kv_cache_dtype="int8", chunked_prefill_size=0)
    want = outputs(whole, (0, 1))
    whole.shutdown()
    eng = make_engine(tiny_dir, kv_cache_dtype="int8", chunked_prefill_size=64)
    assert outputs(eng, (0, 1, 0)) == want  # in chunks: each chunk reads the packed rows of the last
    a = eng.generate(input_ids=PROMPTS[2], sampling_params={**GREEDY, "cache_salt": "a"})
    b = eng.generate(input_ids=PROMPTS[2], sampling_params={**GREEDY, "cache_salt": "b"})
    assert b["meta_info"]["cached_tokens"] == 0 and a["output_ids"] == b["output_ids"]
    eng.check_invariants()
    eng.shutdown()


def test_warm_restart_of_a_packed_pool(tiny_dir, tmp_path):
    folder = str(tmp_path / "kv")
    eng = make_engine(tiny_dir, kv_cache_dtype="fp8_e4m3", cache_persist_dir=folder)
    before = eng.generate(input_ids=PROMPTS[0], sampling_params=GREEDY)
    eng.shutdown()
    eng = make_engine(tiny_dir, kv_cache_dtype="fp8_e4m3", cache_persist_dir=folder)
    after = eng.generate(input_ids=PROMPTS[0], sampling_params=GREEDY)
    assert after["meta_info"]["cached_tokens"] == DOC - 1 and after["output_ids"] == before["output_ids"]
    eng.shutdown()
    exact = make_engine(tiny_dir, cache_persist_dir=folder)  # another pool format: the file is skipped
    assert exact.stats()["cache_size"] == 0
    exact._persister = None
    exact.shutdown()


def test_more_tokens_in_the_same_memory(tiny_dir):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tiny_dir)
    sched = SchedulerConfig()
    slots = {}
    for kind in ("auto", "bf16", "int8", "fp8_e4m3"):
        cfg = CacheConfig(kv_cache_dtype=kind, mem_fraction_static=1.0)
        dtype = torch.bfloat16 if kind == "bf16" else torch.float32
        slots[kind] = kv_layout(config, cfg, sched, dtype, torch.device("cpu"), (2, 16, False), 512,
                                free_bytes=1 << 24).num_slots
    # head_dim 16: 64 bytes a head in fp32, 32 in bf16, 20 packed
    assert slots["bf16"] == pytest.approx(2 * slots["auto"], abs=2)
    assert slots["int8"] == slots["fp8_e4m3"] == pytest.approx(3.2 * slots["auto"], abs=4)


def test_refusals(tiny_dir):
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        CacheConfig(kv_cache_dtype="int4")
    with pytest.raises(ValueError, match="hicache_kv_dtype"):
        CacheConfig(kv_cache_dtype="int8", enable_hierarchical_cache=True, hicache_kv_dtype="fp8_e4m3")
    assert dataclasses.replace(CacheConfig(), kv_cache_dtype="bf16").kv_quantized is False


def test_speculation_and_retraction(tiny_dir):
    """Speculative verification writes and reads the drafted tokens' packed rows; a retracted
    request's rows stay cached and are read back: the greedy output is the plain decode's."""
    prompts = [PROMPTS[i][:60] for i in range(4)]
    params = {**GREEDY, "max_new_tokens": 40}
    plain = make_engine(tiny_dir, kv_cache_dtype="int8")
    want = [o["output_ids"] for o in plain.generate(input_ids=prompts, sampling_params=params)]
    plain.shutdown()
    eng = make_engine(tiny_dir, kv_cache_dtype="int8", speculative_algorithm="ngram")
    assert [o["output_ids"] for o in eng.generate(input_ids=prompts, sampling_params=params)] == want
    eng.check_invariants()
    eng.shutdown()
    eng = make_engine(tiny_dir, kv_cache_dtype="int8", max_total_tokens=240, chunked_prefill_size=32,
                      new_token_ratio=0.05)
    assert [o["output_ids"] for o in eng.generate(input_ids=prompts, sampling_params=params)] == want
    assert eng.stats()["retractions"] > 0
    eng.check_invariants()
    eng.shutdown()


def test_lossy_form_checked_per_model(tmp_path, monkeypatch):
    """A lossy pool form is measured once per model (then cached) and refused below the bar with
    its numbers; an exact pool is not measured."""
    from radixserve.worker.tuning import kv_accuracy

    calls = []
    rate = {"value": 0.99}

    def fake_measure(model, hf_dir, pool_dtype, kind):
        calls.append((pool_dtype, kind))
        return rate["value"], 1327

    class Model:
        def kv_cache_shape(self):
            return 3, 64, False

    monkeypatch.setattr(kv_accuracy, "measure", fake_measure)
    monkeypatch.setattr(kv_accuracy.calibration, "model_fingerprint", lambda hf_dir: "fp-" + hf_dir)
    cache = str(tmp_path / "kv_accuracy.json")
    check = kv_accuracy.check_pool_form
    assert check(Model(), "m", CacheConfig(), torch.float32, torch.float32, cache) is None and not calls
    assert check(Model(), "m", CacheConfig(kv_cache_dtype="int8"), torch.float32, torch.float32, cache) == (0.99, 1327)
    assert check(Model(), "m", CacheConfig(kv_cache_dtype="int8"), torch.float32, torch.float32, cache) == (0.99, 1327)
    assert calls == [(torch.float32, "int8")]  # the second start read the cache
    rate["value"] = 0.972  # lower bound 96.4% over 1,327 positions
    with pytest.raises(ValueError, match=r"kv_cache_dtype: fp8_e4m3 is not offered.*97\.20% of 1327.*or int8"):
        check(Model(), "m", CacheConfig(kv_cache_dtype="fp8_e4m3"), torch.float32, torch.float32, cache)
    rate["value"] = 0.997  # bf16 under an fp32 model is lossy too: measured, with no packing
    assert check(Model(), "m", CacheConfig(kv_cache_dtype="bf16"), torch.float32, torch.bfloat16, cache) == (0.997, 1327)
    assert calls[-1] == (torch.bfloat16, None)
