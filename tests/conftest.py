"""Shared fixtures: a tiny random-init Llama (no download) and the default SmolLM2 weights;
the tiny server and engine behind the frontend_lang backends of the tests/test_frontend_*.py
modules.  Plain helpers live in tests/helpers/ (``from tests.helpers.models import make_engine``)."""
from __future__ import annotations

import os
import time

import pytest
import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# plain helper modules of tests/: their asserts report values like a test's own
pytest.register_assert_rewrite("tests.helpers")

from tests.helpers.models import build_tiny_llama, make_engine  # noqa: E402 (after the rewrite hook)


@pytest.fixture(scope="session")
def smol_dir() -> str:
    """Hugging Face directory of the default SmolLM2 weights (converted from GGUF once)."""
    from radixserve.model.loader import resolve_hf_dir

    return resolve_hf_dir(None)


@pytest.fixture(scope="session")
def smol_hf(smol_dir):
    """HF transformers' fp32 SmolLM2, the oracle of the real-weights tests (loaded once)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smol_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory, smol_dir) -> str:
    """A 2-layer random Llama (GQA 4:2, qkv without bias) with SmolLM2's tokenizer."""
    return build_tiny_llama(smol_dir, str(tmp_path_factory.mktemp("tiny_llama")))


@pytest.fixture(scope="session")
def tiny_hf(tiny_dir):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tiny_engine(tiny_dir):
    return make_engine(tiny_dir)


@pytest.fixture(scope="session")
def smol_server(smol_dir):
    """One SmolLM2 server (fp32, 30000 KV slots: room for the examples' and the constrained
    cases' batches) for the session's slow HTTP tests: one start of the real model, not one
    per module."""
    from tests.helpers.server_harness import ServerHandle

    srv = ServerHandle(smol_dir, "--max-total-tokens", "30000").wait_ready()
    yield srv
    srv.stop()


# ---------------------------------------------------------------- frontend_lang backends
# Used by tests/frontend/test_frontend_lang.py and tests/frontend/test_frontend_batch_errors.py, which also
# apply ``kv_invariants`` to each of their tests (pytestmark usefixtures).
@pytest.fixture(scope="module")
def server(tiny_dir):
    """The session's tiny-model server (test modules with a server of their own override this)."""
    from tests.helpers.server_harness import shared_server

    return shared_server(tiny_dir)


@pytest.fixture(scope="module")
def oai(server):
    """The official ``openai`` client on ``server``'s /v1 routes."""
    import openai
    from tests.helpers.server_harness import API_KEY

    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def http_backend(server):
    from frontend_lang import RuntimeEndpoint
    from tests.helpers.server_harness import API_KEY

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
    from tests.helpers import server_harness
    from tests.helpers.server_harness import ServerHandle

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
