"""A tiny random Llama-3 (llama3 rope scaling) checkpoint, greedy against HF transformers in
fp32 (the other families: test_families.py)."""
from __future__ import annotations

import pytest
import torch

from tests.helpers.models import hf_greedy, make_engine

COMMON = dict(vocab_size=49152, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6)


def _configs():
    from transformers import LlamaConfig, MistralConfig, Qwen2Config

    return {
        "llama3": (LlamaConfig, dict(COMMON, tie_word_embeddings=False, rope_theta=500000.0, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64})),
        "qwen2": (Qwen2Config, dict(COMMON, tie_word_embeddings=True)),
        "mistral": (MistralConfig, dict(COMMON, tie_word_embeddings=False, head_dim=32, sliding_window=None)),
    }


@pytest.mark.parametrize("arch", ["llama3"])
def test_architecture_greedy_matches_hf(arch, tmp_path, smol_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cls, kw = _configs()[arch]
    torch.manual_seed(1)
    hf = AutoModelForCausalLM.from_config(cls(**kw)).eval()
    with torch.no_grad():
        hf.model.embed_tokens.weight.mul_(40.0)
        if arch == "qwen2":
            hf.model.layers[0].self_attn.q_proj.bias.normal_(0, 1.0)
            hf.model.layers[0].self_attn.k_proj.bias.normal_(0, 1.0)
    hf.save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(smol_dir).save_pretrained(tmp_path)
    eng = make_engine(str(tmp_path), max_total_tokens=2048)
    prompts = [list(range(100, 100 + n)) for n in (3, 90, 150)]
    outs = eng.generate(input_ids=prompts, sampling_params={"max_new_tokens": 12, "temperature": 0})
    for p, o in zip(prompts, outs):
        assert o["output_ids"] == hf_greedy(hf, p, 12), arch
