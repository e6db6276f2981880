"""The rotary tables of every rope_type a config can name, against transformers' own rotary
embedding (cos/sin at every position), and the two variants that depend on the sequence length."""
from __future__ import annotations

import pytest
import torch

from radixserve.model.cpu.fused_ops import TorchOps
from radixserve.model.layers.rotary import build_rotary

HEAD, POSITIONS, ORIG = 32, 300, 128
VARIANTS = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    "llama3": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    "yarn": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": ORIG},
    "dynamic": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
    "longrope": {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": ORIG,
                 "short_factor": [1.0 + 0.05 * i for i in range(HEAD // 2)],
                 "long_factor": [2.0 + 0.25 * i for i in range(HEAD // 2)]},
}


def _config(rope: dict, max_pos: int = POSITIONS):
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=4 * HEAD, num_attention_heads=4, num_key_value_heads=2, head_dim=HEAD,
                       max_position_embeddings=max_pos, rope_parameters=dict(rope))


def _hf_tables(config, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    rot = LlamaRotaryEmbedding(config)
    cos, sin = rot(torch.zeros(1, dtype=torch.float32), positions[None])
    return cos[0], sin[0]


@pytest.mark.parametrize("kind", sorted(VARIANTS))
def test_tables_equal_transformers(kind):
    config = _config(VARIANTS[kind])
    ours = build_rotary(config, HEAD, POSITIONS, TorchOps)
    # within the original length: every variant is one table in the reference too
    pos = torch.arange(ORIG if kind == "longrope" else POSITIONS)
    cos, sin = _hf_tables(config, pos)
    torch.testing.assert_close(ours.cos[pos], cos, rtol=0, atol=2e-6)
    torch.testing.assert_close(ours.sin[pos], sin, rtol=0, atol=2e-6)


def test_longrope_takes_the_long_factors_past_the_original_length():
    config = _config(VARIANTS["longrope"])
    ours = build_rotary(config, HEAD, POSITIONS, TorchOps)
    pos = torch.arange(ORIG, POSITIONS)
    cos, sin = _hf_tables(config, torch.arange(POSITIONS))  # a sequence past ORIG: the long factors
    torch.testing.assert_close(ours.cos[pos], cos[pos], rtol=0, atol=2e-6)
    torch.testing.assert_close(ours.sin[pos], sin[pos], rtol=0, atol=2e-6)


def test_dynamic_ntk_refuses_a_context_past_the_trained_length():
    config = _config(VARIANTS["dynamic"], max_pos=256)
    build_rotary(config, HEAD, 257, TorchOps)  # up to max_position_embeddings: the plain table
    with pytest.raises(ValueError, match="dynamic"):
        build_rotary(config, HEAD, 1024, TorchOps)


def test_unknown_rope_type_is_named():
    config = _config({"rope_type": "default", "rope_theta": 10000.0})
    config.rope_parameters = {"rope_type": "wobbly", "rope_theta": 10000.0}
    with pytest.raises(ValueError, match="wobbly"):
        build_rotary(config, HEAD, POSITIONS, TorchOps)
