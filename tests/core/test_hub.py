"""Models by name (radixserve/model/hub.py) against a local stand-in for the Hugging Face Hub
(tests/helpers/fake_hub.py; ``HF_ENDPOINT`` points at it, nothing reaches the real Hub): a Hub id,
a revision and a Hub GGUF (``:QUANT`` and ``gguf_file``) give the tokens of the same model loaded
from disk, only the files serving needs are fetched, a filled cache serves offline, and each
failure is one line (tests/core/test_hub_errors.py)."""
from __future__ import annotations

import os
import shutil

import gguf
import pytest

from radixserve.config import EngineConfig
from radixserve.model import hub as hubmod
from radixserve.model.loader import cache_root
from tests.helpers.fake_hub import FakeHub, dir_files
from tests.helpers.gguf_writer import write_gguf
from tests.helpers.models import build_tiny_llama, make_engine

GEN = {"max_new_tokens": 8, "temperature": 0}
PROMPTS = [[1, 2, 3, 4, 5], list(range(300, 340))]
DECOYS = {"pytorch_model.bin": b"not these", "original/consolidated.safetensors": b"nor this", "README.md": b"# tiny",
          "onnx/model.onnx": b"nor this", "tiny-Q8_0.gguf": b"nor this"}


@pytest.fixture(scope="module")
def published(tiny_dir, tmp_path_factory):
    """The Hub's repositories: ``org/tiny`` (main: the tiny Llama and files serving never needs;
    v1: a one-layer Llama), ``org/tiny-GGUF`` (F32 and Q8_0 files of the tiny Llama, two Q4 names)."""
    v1_dir = build_tiny_llama(tiny_dir, str(tmp_path_factory.mktemp("tiny_v1")), layers=1, seed=1)
    gdir = tmp_path_factory.mktemp("tiny_gguf")
    f32 = write_gguf(tiny_dir, str(gdir / "tiny-F32.gguf"))
    q8 = write_gguf(tiny_dir, str(gdir / "tiny-Q8_0.gguf"), gguf.GGMLQuantizationType.Q8_0)
    hub = FakeHub()
    hub.add("org/tiny", {**dir_files(tiny_dir), **DECOYS})
    v1 = hub.add("org/tiny", dir_files(v1_dir), revision="v1")
    hub.add("org/tiny-GGUF", {"tiny-F32.gguf": open(f32, "rb").read(), "tiny-Q8_0.gguf": open(q8, "rb").read(),
                              "tiny-Q4_K_M.gguf": b"unused", "tiny-Q4_K_S.gguf": b"unused", "README.md": b"# GGUF"})
    yield {"hub": hub, "v1_dir": v1_dir, "v1": v1, "q8": q8}
    hub.stop()


@pytest.fixture
def hub(published, monkeypatch, tmp_path):
    """The fake Hub as this test's ``HF_ENDPOINT``, no token, online, an empty shared cache."""
    monkeypatch.setenv("HF_ENDPOINT", published["hub"].url)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hf_cache"))
    published["hub"].fetched.clear()
    return published["hub"]


def greedy(engine) -> list[list[int]]:
    return [engine.generate(input_ids=ids, sampling_params=GEN)["output_ids"] for ids in PROMPTS]


def test_a_name_is_a_hub_id_only_when_no_such_path_exists(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "local" / "model").mkdir(parents=True)
    assert hubmod.is_hub_id("Qwen/Qwen3-0.6B") and hubmod.is_hub_id("unsloth/Qwen3-0.6B-GGUF:Q4_K_M")
    assert not hubmod.is_hub_id("local/model")  # an existing directory stays a path
    for name in (None, "", "SmolLM2", "/abs/dir", "./a/b", "org/model.gguf", "a/b/c", "org/name:"):
        assert not hubmod.is_hub_id(name), name


def test_a_hub_id_serves_the_tokens_of_its_local_directory_and_fetches_only_what_serving_needs(
        hub, tiny_dir, tiny_engine):
    eng = make_engine("org/tiny", dense_kernel="plain")
    try:
        assert greedy(eng) == greedy(tiny_engine)
        assert eng.model_path.startswith(hubmod.fetch("org/tiny"))  # the shared cache, now offline-ready
    finally:
        eng.shutdown()
    assert sorted(os.listdir(eng.model_path)) == sorted(os.listdir(tiny_dir))
    assert hub.fetched_from("org/tiny") == set(os.listdir(tiny_dir))  # no decoy's bytes were sent


def test_a_revision_by_name_or_commit(hub, published, tmp_path):
    cfg = EngineConfig.from_kwargs("org/tiny", revision="v1", download_dir=str(tmp_path / "dl"), dtype="float32")
    local = hubmod.resolve_engine_config(cfg)
    assert local.model.path.startswith(str(tmp_path / "dl")) and local.model.revision == "v1"
    assert dir_files(local.model.path) == dir_files(published["v1_dir"])
    assert hubmod.fetch("org/tiny", published["v1"], str(tmp_path / "dl")) == local.model.path
    eng = make_engine("org/tiny", revision="v1", download_dir=str(tmp_path / "dl"), dense_kernel="plain")
    ref = make_engine(published["v1_dir"], dense_kernel="plain")
    try:
        assert greedy(eng) == greedy(ref)
    finally:
        eng.shutdown()
        ref.shutdown()


def test_a_hub_gguf_by_quant_or_by_file_serves_through_the_gguf_conversion(hub, tiny_engine):
    # F32 GGUF files give the original checkpoint's tokens (tests/core/test_gguf_families.py)
    by_quant = make_engine("org/tiny-GGUF:f32", dense_kernel="plain")
    try:
        assert greedy(by_quant) == greedy(tiny_engine)
        by_file = make_engine("org/tiny-GGUF", gguf_file="tiny-F32.gguf", dense_kernel="plain")
        try:
            assert by_file.model_path == by_quant.model_path  # the same file, converted once
            assert greedy(by_file) == greedy(tiny_engine)
        finally:
            by_file.shutdown()
    finally:
        by_quant.shutdown()
        if by_quant.model_path.startswith(os.path.join(cache_root(), "gguf")):
            shutil.rmtree(by_quant.model_path, ignore_errors=True)  # this run's conversion (the blob is new)
    assert hub.fetched_from("org/tiny-GGUF") == {"tiny-F32.gguf"}


def test_a_quant_picks_one_file_case_insensitively(hub, published):
    path = hubmod.fetch("org/tiny-GGUF:q8_0")
    assert os.path.basename(path) == "tiny-Q8_0.gguf" and open(path, "rb").read() == open(published["q8"], "rb").read()
    cfg = hubmod.resolve_engine_config(EngineConfig.from_kwargs("org/tiny-GGUF", gguf_file="tiny-Q8_0.gguf"))
    assert cfg.model.path == path and cfg.model.gguf_file is None  # the children see a local file
    assert hub.fetched_from("org/tiny-GGUF") == {"tiny-Q8_0.gguf"}


def test_a_hub_tokenizer_fetches_no_weights(hub):
    cfg = hubmod.resolve_engine_config(EngineConfig.from_kwargs(None, tokenizer_path="org/tiny"))
    assert cfg.model.path is None and "tokenizer.json" in os.listdir(cfg.model.tokenizer_path)
    assert not any(f.endswith((".safetensors", ".bin")) for f in os.listdir(cfg.model.tokenizer_path))


def test_a_filled_cache_serves_offline_with_the_hub_gone(tiny_dir, tiny_engine, monkeypatch, tmp_path):
    gone = FakeHub()
    gone.add("org/tiny", dir_files(tiny_dir))
    gone.add("org/tiny-GGUF", {"tiny-Q8_0.gguf": b"q8 bytes"})
    monkeypatch.setenv("HF_ENDPOINT", gone.url)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    cache = str(tmp_path / "cache")
    online = hubmod.fetch("org/tiny", cache_dir=cache), hubmod.fetch("org/tiny-GGUF:Q8_0", cache_dir=cache)
    gone.stop()
    assert (hubmod.fetch("org/tiny", cache_dir=cache), hubmod.fetch("org/tiny-GGUF:Q8_0", cache_dir=cache)) == online
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no request at all: the listing comes from the cache
    eng = make_engine("org/tiny", download_dir=cache, dense_kernel="plain")
    try:
        assert eng.model_path == online[0] and greedy(eng) == greedy(tiny_engine)
    finally:
        eng.shutdown()
