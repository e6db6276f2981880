"""Gemma 2 / Gemma 3 specifics against transformers: the folded ``1 + w`` norms (bit-exact in
fp32), the rope of each layer type, each layer's attention, refused config features, and the
whole model on the ``torch_native`` backend (``test_families.py`` runs the default one; the
multimodal ``gemma3`` refusal is tested with the registry)."""
from __future__ import annotations

import pytest
import torch

from tests.helpers.families import FAMILIES, WINDOW, build_family
from tests.helpers.models import hf_greedy, hf_prompt_logprobs, make_engine


def _config(name: str, **kw):
    cls, base = FAMILIES[name]()
    return cls(**dict(base, **kw))


def _models(name: str):
    """(transformers model with random norm weights, our model loaded from its state dict)."""
    from transformers import AutoModelForCausalLM

    from radixserve.model.registry import model_class

    config = _config(name)
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for n, p in hf.named_parameters():
            if "norm" in n:
                p.add_(torch.randn_like(p) * 0.3)
    ours = model_class(config)(config, 256)
    ours.load_weights(hf.state_dict().items())
    return hf, ours


@pytest.mark.parametrize("name", ["gemma2", "gemma3"])
def test_folded_norms_equal_gemma_norms_bit_for_bit_in_fp32(name):
    hf, ours = _models(name)
    x = torch.randn(5, ours.config.hidden_size) * 3
    pairs = [(hf.model.norm, ours.norm)]
    for h, o in zip(hf.model.layers, ours.layers):
        pairs += [(getattr(h, n), getattr(o, n)) for n in ("input_layernorm", "post_attention_layernorm",
                                                          "pre_feedforward_layernorm", "post_feedforward_layernorm")]
    for h, o in pairs:
        assert torch.equal(o(x), h(x))
    if name == "gemma3":  # per-head q/k norms
        heads = torch.randn(7, ours.layout.head_dim)
        for h, o in zip(hf.model.layers, ours.layers):
            assert torch.equal(o.self_attn.q_norm(heads), h.self_attn.q_norm(heads))
            assert torch.equal(o.self_attn.k_norm(heads), h.self_attn.k_norm(heads))


def test_gemma3_rope_per_layer_type():
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding

    hf, ours = _models("gemma3")
    ref = Gemma3RotaryEmbedding(hf.config)
    pos = torch.arange(200)[None]
    tables = {}
    for kind, layer in zip(hf.config.layer_types, ours.layers):
        cos, sin = ref(torch.zeros(1, dtype=torch.float32), pos, kind)
        rot = layer.self_attn.rotary
        assert torch.equal(rot.cos[:200], cos[0]) and torch.equal(rot.sin[:200], sin[0])
        assert tables.setdefault(kind, rot) is rot  # one table per layer type
    assert not torch.equal(tables["sliding_attention"].cos, tables["full_attention"].cos)


@pytest.mark.parametrize("name,cap", [("gemma2", 5.0), ("gemma3", None)])
def test_layer_attention_windows_sliding_layers_and_caps_gemma2(name, cap):
    from radixserve.attention.base import LayerAttention
    from radixserve.model.registry import model_class

    # Gemma 3's reference ignores attn_logit_softcapping: so do we
    config = _config(name, attn_logit_softcapping=5.0)
    want = [LayerAttention(WINDOW if t == "sliding_attention" else None, cap) for t in config.layer_types]
    assert model_class(config)(config, 256).layer_attention() == want


def test_unbuilt_features_are_refused_by_name():
    from radixserve.model.registry import model_class

    with pytest.raises(ValueError, match="use_bidirectional_attention"):
        model_class(_config("gemma3", use_bidirectional_attention=True))
    with pytest.raises(ValueError, match="attention_bias"):
        model_class(_config("gemma2", attention_bias=True))


@pytest.mark.parametrize("name", ["gemma2", "gemma3"])
def test_torch_native_backend_matches_transformers(name, tmp_path, smol_dir):
    hf = build_family(name, str(tmp_path), smol_dir)
    prompts = [list(range(300, 305)), list(range(400, 400 + 3 * WINDOW + 5))]
    eng = make_engine(str(tmp_path), max_total_tokens=1024, attention_backend="torch_native")
    out = eng.generate(input_ids=prompts, sampling_params={"max_new_tokens": 16, "temperature": 0})
    assert [o["output_ids"] for o in out] == [hf_greedy(hf, p, 16) for p in prompts]
    lp = eng.generate(input_ids=prompts[1], sampling_params={"max_new_tokens": 1}, return_logprob=True,
                      logprob_start_len=0)
    got = [t[0] for t in lp["meta_info"]["input_token_logprobs"][1:]]
    want = hf_prompt_logprobs(hf, prompts[1])
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < 1e-4
