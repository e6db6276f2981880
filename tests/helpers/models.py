"""Plain helpers shared by test modules (``from tests.helpers.models import make_engine``):
the tiny random Llama, Engine construction with test defaults, HF greedy/logprob oracles,
random prompts with a shared system prefix.  Fixtures built on them live in tests/conftest.py."""
from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Optional

import torch


def build_tiny_llama(smol_dir: str, path: str, *, hidden: int = 64, layers: int = 2, heads: int = 4,
                     kv_heads: int = 2, seed: int = 0, tie: bool = True) -> str:
    """Save a random Llama with SmolLM2's tokenizer in ``path``; return it.  The defaults are
    ``tiny_dir``'s model (seeded, so always the same weights); the MLP is twice ``hidden``."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(smol_dir)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                      max_position_embeddings=1024, rms_norm_eps=1e-5, tie_word_embeddings=tie,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    # random init gives near-uniform logits; sharpen them so greedy ties are impossible
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(40.0)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def walk(node: dict) -> list[dict]:
    """Every node of a ``/cache/tree`` answer's tree (depth first)."""
    out, stack = [], [node]
    while stack:
        n = stack.pop()
        out.append(n)
        stack.extend(n["children"])
    return out


def pinned_dense_kernel(path: Optional[str], device: str = "cpu", dtype: str = "float32") -> str:
    """The dense-linear path the tests pin for a model, never the one a timing would pick:
    plain ``F.linear`` for the tiny random models (a few 64-wide matrices), oneDNN-packed
    weights for real ones (SmolLM2) wherever this torch build and CPU can pack ``dtype`` (bf16
    packing needs AVX-512 or AVX-NE-CONVERT; "auto" may become either), plain elsewhere.  The
    choice rests on the model's shape and the machine's capabilities alone, never on a timing;
    tests of one path ask for it by name."""
    from radixserve.model.quant.packed import available

    cfg = Path(path) / "config.json" if path else None
    hidden = json.loads(cfg.read_text()).get("hidden_size", 0) if cfg is not None and cfg.is_file() else None
    tiny = hidden is not None and hidden < 256
    dtypes = [torch.float32, torch.bfloat16] if dtype == "auto" else [getattr(torch, dtype, torch.float32)]
    return "packed" if device == "cpu" and not tiny and all(available(d) for d in dtypes) else "plain"


def make_engine(path: str, **kw):
    """An Engine with the test defaults: fp32, ``dense_kernel`` pinned by
    ``pinned_dense_kernel`` (a test of one path asks for it) and an 8192-slot KV pool."""
    from radixserve import Engine

    kw.setdefault("dtype", "float32")
    kw.setdefault("dense_kernel", pinned_dense_kernel(path, kw.get("device", "cpu"), kw["dtype"]))
    kw.setdefault("max_total_tokens", 8192)
    return Engine(path, **kw)


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


SYSTEM = list(range(1000, 1100))  # a shared 100-token "system prompt"


def random_prompts(seed: int, n: int) -> list[list[int]]:
    """``n`` random token prompts; every other one starts with ``SYSTEM``."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        body = [rng.randrange(200, 40000) for _ in range(rng.randrange(1, 60))]
        out.append((SYSTEM + body) if i % 2 == 0 else body)
    return out
