"""Shared fixtures: a tiny random-init Llama (no download) and the default SmolLM2 weights;
the tiny server and engine behind the frontend_lang backends of the tests/test_frontend_*.py
modules; helpers that several test modules import (``from conftest import make_engine``)."""
from __future__ import annotations

import os
import random
import time

import pytest
import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# plain helper modules of tests/: their asserts report values like a test's own
pytest.register_assert_rewrite("kv_helpers", "kv_sim", "frontend_programs")


@pytest.fixture(scope="session")
def smol_dir() -> str:
    """Hugging Face directory of the default SmolLM2 weights (converted from GGUF once)."""
    from radixserve.model.loader import resolve_hf_dir

    return resolve_hf_dir(None)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory, smol_dir) -> str:
    """A 2-layer random Llama (GQA 4:2, qkv without bias) with SmolLM2's tokenizer."""
    return build_tiny_llama(smol_dir, str(tmp_path_factory.mktemp("tiny_llama")))


def build_tiny_llama(smol_dir: str, path: str) -> str:
    """Save ``tiny_dir``'s model (seeded, so always the same weights) in ``path``; return it."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(smol_dir)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    # random init gives near-uniform logits; sharpen them so greedy ties are impossible
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(40.0)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_hf(tiny_dir):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()


def walk(node: dict) -> list[dict]:
    """Every node of a ``/cache/tree`` answer's tree (depth first)."""
    out, stack = [], [node]
    while stack:
        n = stack.pop()
        out.append(n)
        stack.extend(n["children"])
    return out


def make_engine(path: str, **kw):
    from radixserve import Engine

    kw.setdefault("dtype", "float32")
    kw.setdefault("max_total_tokens", 8192)
    return Engine(path, **kw)


@pytest.fixture(scope="module")
def tiny_engine(tiny_dir):
    return make_engine(tiny_dir)


def hf_greedy(hf_model, ids: list[int], n: int) -> list[int]:
    out = hf_model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                            max_new_tokens=n, do_sample=False, pad_token_id=0)
    return out[0, len(ids):].tolist()


def hf_prompt_logprobs(hf_model, ids: list[int]) -> list[float]:
    """log p(ids[i] | ids[:i]) for i >= 1."""
    with torch.no_grad():
        logits = hf_model(torch.tensor([ids])).logits[0].float()
    lp = torch.log_softmax(logits, -1)
    return [lp[i - 1, ids[i]].item() for i in range(1, len(ids))]


@pytest.fixture(scope="session")
def smol_server(smol_dir):
    """One SmolLM2 server (fp32, 4096 KV slots) for the session's slow HTTP tests."""
    from server_harness import ServerHandle

    srv = ServerHandle(smol_dir, "--max-total-tokens", "4096").wait_ready()
    yield srv
    srv.stop()


SYSTEM = list(range(1000, 1100))  # a shared 100-token "system prompt"


def random_prompts(seed: int, n: int) -> list[list[int]]:
    """``n`` random token prompts; every other one starts with ``SYSTEM``."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        body = [rng.randrange(200, 40000) for _ in range(rng.randrange(1, 60))]
        out.append((SYSTEM + body) if i % 2 == 0 else body)
    return out


# ---------------------------------------------------------------- frontend_lang backends
# Used by tests/test_frontend_lang.py and tests/test_frontend_batch_errors.py, which also
# apply ``kv_invariants`` to each of their tests (pytestmark usefixtures).
@pytest.fixture(scope="module")
def server(tiny_dir):
    """The session's tiny-model server (test modules with a server of their own override this)."""
    from server_harness import shared_server

    return shared_server(tiny_dir)


@pytest.fixture(scope="module")
def oai(server):
    """The official ``openai`` client on ``server``'s /v1 routes."""
    import openai
    from server_harness import API_KEY

    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def http_backend(server):
    from frontend_lang import RuntimeEndpoint
    from server_harness import API_KEY

    be = RuntimeEndpoint(server.url, api_key=API_KEY)
    yield be
    be.shutdown()


@pytest.fixture(scope="module")
def engine_backend(tiny_dir):
    from frontend_lang import EngineBackend

    be = EngineBackend(make_engine(tiny_dir))
    yield be
    be.shutdown()


def _engine_idle_invariants(sched) -> None:
    assert not sched.has_work(), sched.stats()
    sched.check_invariants()


@pytest.fixture
def kv_invariants(request):
    """After the test: no request holds a KV slot and the allocator's invariants hold, on
    the shared server and on the in-process engine (checked on its driver thread) -- for
    whichever of the two the test used, directly or through ``backend``.  Not autouse: a
    module opts in with ``pytestmark = pytest.mark.usefixtures("kv_invariants")``."""
    from frontend_lang import EngineBackend, RuntimeEndpoint
    import server_harness
    from server_harness import ServerHandle

    yield
    used = list(request.node.funcargs.values())
    if any(isinstance(v, (RuntimeEndpoint, ServerHandle)) for v in used):
        s = server_harness._shared.wait_idle()["scheduler"]
        assert s["invariants_ok"], s["invariant_error"]
        assert s["held_slots"] == 0, s
    for be in (v for v in used if isinstance(v, EngineBackend)):
        deadline = time.time() + 30
        while be.engine.run_on_driver(lambda s: s.has_work(), 30) and time.time() < deadline:
            time.sleep(0.1)
        be.engine.run_on_driver(_engine_idle_invariants, 30)


@pytest.fixture(params=["http", "engine"])
def backend(request):
    return request.getfixturevalue(f"{request.param}_backend")


@pytest.fixture(scope="module")
def tok(tiny_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)
