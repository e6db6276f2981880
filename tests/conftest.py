"""Shared fixtures: a tiny random-init Llama (no download) and the default SmolLM2 weights."""
from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def smol_dir() -> str:
    """Hugging Face directory of the default SmolLM2 weights (converted from GGUF once)."""
    from radixserve.model.loader import resolve_hf_dir

    return resolve_hf_dir(None)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory, smol_dir) -> str:
    """A 2-layer random Llama (GQA 4:2, qkv without bias) with SmolLM2's tokenizer."""
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
    path = str(tmp_path_factory.mktemp("tiny_llama"))
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_hf(tiny_dir):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()


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
