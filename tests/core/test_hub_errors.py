"""Each way a model named by its Hub id cannot be had is one clear line (radixserve/model/hub.py):
from ``fetch``, from ``Engine`` (a ``HubError``) and from ``radixserve serve`` (exit status 1, no
traceback).  Against the local stand-in for the Hub (tests/helpers/fake_hub.py)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from radixserve.model import hub as hubmod
from tests.helpers.fake_hub import FakeHub
from tests.helpers.server_harness import free_port

TINY = {"config.json": b'{"model_type": "llama"}', "tokenizer.json": b"{}", "model.safetensors": b"weights"}


@pytest.fixture(scope="module")
def fake_hub():
    hub = FakeHub()
    hub.add("org/tiny", TINY)
    hub.add("org/gated", TINY, gated=True)
    hub.add("org/onnx-only", {"config.json": b"{}", "model.onnx": b"x", "README.md": b"# onnx"})
    hub.add("org/tiny-GGUF", {f"tiny-{q}.gguf": b"gguf" for q in ("Q4_K_M", "Q4_K_S", "Q8_0")})
    yield hub
    hub.stop()


@pytest.fixture
def hub(fake_hub, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_ENDPOINT", fake_hub.url)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hf_cache"))
    return fake_hub


def one_line(ref: str, **kw) -> str:
    with pytest.raises(hubmod.HubError) as e:
        hubmod.fetch(ref, **kw)
    text = str(e.value)
    assert text and "\n" not in text and "Traceback" not in text, text
    return text


# (reference, fetch keywords, words the line must hold)
CASES = {
    "unknown repository": ("no-such/repo", {}, ["'no-such/repo'", "neither a local path nor a repository",
                                                 "HF_TOKEN"]),
    "gated without a token": ("org/gated", {}, ["org/gated is gated", "HF_TOKEN"]),
    "unknown revision": ("org/tiny", {"revision": "no-such-branch"}, ["revision:", "'no-such-branch'"]),
    "no supported weights": ("org/onnx-only", {}, ["no weights in a supported format", "model.onnx"]),
    "only GGUF weights, no quant": ("org/tiny-GGUF", {}, ["no weights in a supported format", "org/tiny-GGUF:QUANT",
                                                          "tiny-Q8_0.gguf"]),
    "a quant no file has": ("org/tiny-GGUF:Q5_K_M", {}, ["no GGUF file matching Q5_K_M", "tiny-Q4_K_S.gguf"]),
    "a quant several files have": ("org/tiny-GGUF:q4_k", {}, ["matches several", "tiny-Q4_K_M.gguf",
                                                              "tiny-Q4_K_S.gguf"]),
    "a gguf file the repository lacks": ("org/tiny-GGUF", {"gguf_file": "tiny-F16.gguf"},
                                         ["gguf_file:", "'tiny-F16.gguf'", "tiny-Q8_0.gguf"]),
    "a quant and a gguf file": ("org/tiny-GGUF:Q8_0", {"gguf_file": "tiny-Q8_0.gguf"}, ["not both"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_failure_is_one_line_naming_it(hub, case):
    ref, kw, words = CASES[case]
    text = one_line(ref, **kw)
    assert all(w in text for w in words), text


def test_a_gated_repository_opens_with_the_token(hub, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", FakeHub.TOKEN)
    assert sorted(os.listdir(hubmod.fetch("org/gated"))) == sorted(TINY)
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    assert "the token (HF_TOKEN) has no access" in one_line("org/gated", cache_dir=None)


def test_offline_with_an_empty_cache(hub, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    text = one_line("org/tiny", cache_dir=str(tmp_path / "empty"))
    assert "HF_HUB_OFFLINE is set" in text and "org/tiny" in text and "not in the cache" in text
    assert not hub.fetched_from("org/tiny")


def test_an_unreachable_hub_with_an_empty_cache(hub, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    text = one_line("org/tiny", cache_dir=str(tmp_path / "empty"))
    assert "cannot be reached" in text and "not in the cache" in text


def test_a_gguf_file_needs_a_hub_repository(tmp_path):
    from radixserve.config import EngineConfig

    with pytest.raises(ValueError, match="gguf_file: .*ORG/NAME"):
        EngineConfig.from_kwargs("org/tiny-GGUF:Q8_0", gguf_file="tiny-Q8_0.gguf")
    cfg = EngineConfig.from_kwargs(str(tmp_path), gguf_file="tiny-Q8_0.gguf")
    with pytest.raises(hubmod.HubError, match="is a local path"):
        hubmod.resolve_engine_config(cfg)


def test_the_engine_raises_the_line(hub):
    from radixserve import Engine

    with pytest.raises(hubmod.HubError, match=r"^model: 'no-such/repo' is neither a local path"):
        Engine("no-such/repo", dtype="float32")


def test_the_served_name_of_a_hub_model_is_its_id():
    from radixserve.server.launcher import model_name

    assert model_name("Qwen/Qwen3-0.6B") == "Qwen/Qwen3-0.6B"
    assert model_name("unsloth/Qwen3-0.6B-GGUF:Q4_K_M") == "unsloth/Qwen3-0.6B-GGUF"
    assert model_name("/models/SmolLM2.Q4_1.gguf") == "SmolLM2.Q4_1"


def test_serve_exits_with_one_line_and_no_traceback(fake_hub, tmp_path):
    env = dict(os.environ, HF_ENDPOINT=fake_hub.url, HF_HOME=str(tmp_path / "hf_home"), TOKENIZERS_PARALLELISM="false")
    env.pop("HF_TOKEN", None)
    env.pop("HF_HUB_OFFLINE", None)
    out = subprocess.run([sys.executable, "-m", "radixserve.cli", "serve", "--model", "no-such/repo",
                          "--port", str(free_port()), "--log-level", "warning"],
                         capture_output=True, text=True, timeout=120, env=env)
    lines = [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert len(lines) == 1 and "cannot start: model: 'no-such/repo' is neither a local path" in lines[0], lines
