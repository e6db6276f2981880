"""The hierarchical cache through the in-process Engine (tiny model): the same greedy output
whether a prefix is computed or comes back from the pool, the host tier or the disk tier,
with chunked prefill, both write policies, speculation, retraction and cache salts; block
files that are truncated, corrupt, deleted or cannot be written are recomputed, never served;
the host tier stays within its byte budget."""
from __future__ import annotations

import glob
import os
import random
import shutil

import psutil
import pytest

from radixserve.worker.tiers import block_store
from tests.helpers.models import make_engine

GREEDY = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
DOC = 500  # tokens a prompt; the pool holds two of them, the host tier four


def ids(seed: int, n: int = DOC) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(200, 40000) for _ in range(n)]


PROMPTS = {i: ids(i) for i in range(8)}


@pytest.fixture(scope="module")
def reference(tiny_dir):
    eng = make_engine(tiny_dir)
    out = {i: eng.generate(input_ids=p, sampling_params=GREEDY)["output_ids"] for i, p in PROMPTS.items()}
    eng.shutdown()
    return out


def tiered(tiny_dir, folder, **kw):
    kw = {"max_total_tokens": 1100, "chunked_prefill_size": 128, "hicache_ratio": 2.0,
          "hicache_storage_backend": "file", **kw}
    return make_engine(tiny_dir, enable_hierarchical_cache=True, hicache_storage_dir=str(folder), **kw)


def run(eng, i, reference, **params):
    out = eng.generate(input_ids=PROMPTS[i], sampling_params={**GREEDY, **params})
    assert out["output_ids"] == reference[i], f"prompt {i}"
    eng.check_invariants()
    return out["meta_info"]["cached_tokens"]


def hits(eng) -> tuple[int, int]:
    s = eng.stats()
    return s["host_hit_tokens"], s["disk_hit_tokens"]


def test_same_output_from_every_tier(tiny_dir, tmp_path, reference):
    eng = tiered(tiny_dir, tmp_path, hicache_write_policy="write_back")  # write_through: the test below
    for i in (0, 1, 2):  # 0 leaves the pool for the host tier
        assert run(eng, i, reference) == 0
    assert run(eng, 0, reference) == DOC - 1 and hits(eng)[0] >= DOC - 1
    for i in (3, 4, 5, 6, 7):  # and then the host tier for the disk
        run(eng, i, reference)
    eng._tiers.blocks.flush()  # the writer thread may not have reached the first block yet
    assert glob.glob(os.path.join(str(tmp_path), "radixserve-hicache-*", "*.rsp"))
    host, disk = hits(eng)
    assert run(eng, 1, reference) == DOC - 1 and hits(eng)[1] > disk
    eng.shutdown()
    assert not glob.glob(os.path.join(str(tmp_path), "radixserve-hicache-*"))  # its folder goes with it


def test_default_dtype_speculation_and_salts(tiny_dir, tmp_path):
    ref_eng = make_engine(tiny_dir, dtype="auto", speculative_algorithm="ngram")
    ref = {i: ref_eng.generate(input_ids=PROMPTS[i], sampling_params=GREEDY)["output_ids"] for i in range(3)}
    ref_eng.shutdown()
    eng = tiered(tiny_dir, tmp_path, dtype="auto", speculative_algorithm="ngram")
    assert run(eng, 0, ref, cache_salt="a") == 0
    for i in (1, 2):  # the salted prefix leaves the pool
        run(eng, i, ref)
    assert run(eng, 0, ref, cache_salt="b") == 0  # another namespace: nothing, in any tier
    assert run(eng, 0, ref, cache_salt="a") == DOC - 1
    assert sum(hits(eng)) >= DOC - 1
    eng.shutdown()


def test_draft_model_speculation(tiny_dir, tmp_path, reference):
    """The host tier holds the draft model's KV too; from disk the draft's is stale (outputs hold)."""
    from tests.helpers.models import build_tiny_llama

    draft = build_tiny_llama(tiny_dir, str(tmp_path / "draft"), hidden=32, layers=1, heads=2, kv_heads=1, seed=1,
                             tie=True)
    eng = tiered(tiny_dir, tmp_path / "blocks", speculative_algorithm="draft", speculative_draft_model=draft,
                 speculative_num_tokens=3)
    assert len(eng._tiers.pools) == 2
    for i in (0, 1, 2, 0, 3, 4, 5, 6, 7, 1):  # 0 back from the host tier, 1 from disk
        run(eng, i, reference)
    assert min(hits(eng)) >= DOC - 1
    eng.shutdown()


def test_retraction_with_tiers(tiny_dir, tmp_path, reference):
    prompts = [PROMPTS[i][:60] for i in range(4)]
    params = {**GREEDY, "max_new_tokens": 60}
    want = make_engine(tiny_dir)
    expected = [o["output_ids"] for o in want.generate(input_ids=prompts, sampling_params=params)]
    want.shutdown()
    eng = tiered(tiny_dir, tmp_path, max_total_tokens=240, chunked_prefill_size=32, new_token_ratio=0.05)
    outs = eng.generate(input_ids=prompts, sampling_params=params)
    assert [o["output_ids"] for o in outs] == expected
    assert eng.stats()["retractions"] > 0
    eng.check_invariants()
    eng.shutdown()


def _push_to_disk(eng, reference) -> None:
    for i in range(8):
        run(eng, i, reference)


@pytest.mark.parametrize("fault", ["truncated", "corrupt", "deleted_folder"])
def test_bad_blocks_are_recomputed(tiny_dir, tmp_path, reference, fault):
    eng = tiered(tiny_dir, tmp_path)
    _push_to_disk(eng, reference)
    eng._tiers.blocks.flush()
    files = glob.glob(os.path.join(str(tmp_path), "radixserve-hicache-*", "*.rsp"))
    assert files
    for f in files:
        if fault == "truncated":
            os.truncate(f, os.path.getsize(f) // 2)
        elif fault == "corrupt":
            with open(f, "r+b") as fh:
                fh.seek(os.path.getsize(f) // 2)
                fh.write(b"\xff" * 64)
    if fault == "deleted_folder":
        shutil.rmtree(eng._tiers.blocks.folder)
    for i in range(8):  # every answer right, whatever the disk held
        run(eng, i, reference)
    assert eng.stats()["failed_loads"] > 0
    _push_to_disk(eng, reference)  # the tier keeps working (the folder is made again)
    eng._tiers.blocks.flush()
    assert glob.glob(os.path.join(eng._tiers.blocks.folder, "*.rsp"))
    eng.shutdown()


def test_disk_full_keeps_serving(tiny_dir, tmp_path, reference, monkeypatch, caplog):
    def full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(block_store, "write_prefix_file", full)
    eng = tiered(tiny_dir, tmp_path)
    _push_to_disk(eng, reference)
    eng._tiers.blocks.flush()
    _push_to_disk(eng, reference)
    assert eng.stats()["lost_blocks"] > 0 and "No space left" in caplog.text
    eng.shutdown()


def test_host_tier_stays_within_its_budget(tiny_dir, tmp_path, reference):
    budget = 0.02  # GB
    eng = tiered(tiny_dir, tmp_path, hicache_size=budget, hicache_storage_backend="none")
    assert eng._tiers.host_bytes <= budget * 1e9
    before = psutil.Process().memory_info().rss
    for _ in range(2):
        _push_to_disk(eng, reference)
    s = eng.stats()
    assert s["host_tokens"] <= s["host_slots"] and s["host_hit_tokens"] > 0
    grown = psutil.Process().memory_info().rss - before
    assert grown <= budget * 1e9 + 64e6, f"RSS grew {grown / 1e6:.0f} MB with a {budget * 1e3:.0f} MB host tier"
    eng.shutdown()


def test_quantized_host_tier_holds_more_tokens(tiny_dir, tmp_path):
    exact = tiered(tiny_dir, tmp_path, hicache_storage_backend="none")
    eng = tiered(tiny_dir, tmp_path, hicache_storage_backend="none", hicache_kv_dtype="int8")
    assert eng._tiers.host_bytes <= exact._tiers.host_bytes and eng.info.host_tier_slots > 3 * exact.info.host_tier_slots
    exact.shutdown()
    for i in (0, 1, 2, 0):  # the last one loads prompt 0 from the int8 host tier
        out = eng.generate(input_ids=PROMPTS[i], sampling_params=GREEDY)
        assert len(out["output_ids"]) == GREEDY["max_new_tokens"]
        eng.check_invariants()
    assert out["meta_info"]["cached_tokens"] == DOC - 1 and hits(eng)[0] >= DOC - 1
    eng.shutdown()


def test_refusals_name_the_option():
    from radixserve.config import EngineConfig
    from radixserve.worker.build import check_config

    with pytest.raises(ValueError, match="enable_hierarchical_cache"):
        check_config(EngineConfig.from_kwargs(None, tp_size=2, enable_hierarchical_cache=True))
    with pytest.raises(ValueError, match="enable_hierarchical_cache"):
        EngineConfig.from_kwargs(None, enable_hierarchical_cache=True, disable_radix_cache=True)
    with pytest.raises(ValueError, match="hicache_kv_dtype"):
        EngineConfig.from_kwargs(None, enable_hierarchical_cache=True, hicache_kv_dtype="int4")


def test_an_unusable_storage_dir_is_named(tiny_dir, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(ValueError, match="hicache_storage_dir"):
        tiered(tiny_dir, blocker)
