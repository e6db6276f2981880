"""Multi-head latent attention (``model/layers/mla.py``, DeepSeek-V2/V3): the pool holds one compressed
vector per token and layer (K and V in one tensor), the attention module and the DeepSeek MoE
block alone match transformers' on random inputs, tensor parallelism is refused and
quantization runs.  Whole models against transformers: tests/core/test_families.py."""
from __future__ import annotations

import pytest
import torch

from radixserve.attention.base import ForwardMode
from radixserve.attention.torch_native import TorchNativeBackend
from radixserve.mem_cache.kv_pool import KVPool
from radixserve.model.arch.deepseek_v2 import DeepseekMoE, DeepseekV2ForCausalLM
from radixserve.model.cpu.fused_ops import TorchOps
from radixserve.model.quant.linear import QuantLinear
from radixserve.parallel.layout import TPLayout
from tests.helpers.attention_cases import paged_batch
from tests.helpers.families import FAMILIES, build_family
from tests.helpers.models import make_engine

YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 256,
        "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.8}


def _config(q_lora_rank, rope=None, **kw):
    from transformers import DeepseekV2Config

    cfg = DeepseekV2Config(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                           num_attention_heads=4, num_key_value_heads=4, q_lora_rank=q_lora_rank, kv_lora_rank=32,
                           qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, first_k_dense_replace=1,
                           max_position_embeddings=1024, rope_parameters=rope, **kw)
    cfg._attn_implementation = "eager"
    return cfg


def test_kv_pool_shares_one_tensor_for_k_and_v():
    pool = KVPool(9, 2, 1, 40, torch.float32, shared_kv=True)
    assert all(v is k for k, v in zip(pool.k_buffer, pool.v_buffer)) and pool.k_buffer[0].shape == (9, 1, 40)
    kv = torch.randn(3, 1, 40)
    pool.set_kv(1, torch.tensor([2, 5, 7]), kv, kv)
    assert torch.equal(pool.v_buffer[1][[2, 5, 7]], kv) and not pool.k_buffer[0].any()
    assert pool.slot_bytes == 2 * 40 * 4 == KVPool.bytes_per_slot(2, 1, 40, torch.float32) // 2
    assert KVPool(9, 2, 1, 40, torch.float32).slot_bytes == 2 * 2 * 40 * 4


def test_engine_pool_holds_latent_and_rope_per_token(tmp_path, smol_dir, tiny_dir):
    path = str(tmp_path / "dsv2")
    hf = build_family("deepseek_v2", path, smol_dir)
    c = hf.config
    pool = make_engine(path, max_total_tokens=64).runner.kv_pool
    width = c.kv_lora_rank + c.qk_rope_head_dim  # 32 + 8
    assert [tuple(b.shape) for b in pool.k_buffer] == [(65, 1, width)] * c.num_hidden_layers
    assert all(v is k for k, v in zip(pool.k_buffer, pool.v_buffer))
    assert pool.slot_bytes == c.num_hidden_layers * width * 4
    # the uncompressed cache of the same attention (per head: K of qk_head_dim, V of v_head_dim): 4x more
    dense = c.num_hidden_layers * c.num_attention_heads * (c.qk_nope_head_dim + c.qk_rope_head_dim + c.v_head_dim) * 4
    assert dense == 4 * pool.slot_bytes
    llama = make_engine(tiny_dir, max_total_tokens=64).runner.kv_pool  # a dense model's pool is as before
    assert llama.k_buffer[0].shape == (65, 2, 16) and llama.v_buffer[0] is not llama.k_buffer[0]
    assert llama.slot_bytes == 2 * 2 * 2 * 16 * 4


@pytest.mark.parametrize("q_lora_rank", [24, None])
@pytest.mark.parametrize("rope", [None, YARN], ids=["default", "yarn"])
def test_mla_module_matches_transformers_attention(q_lora_rank, rope):
    """Layer 0's attention on random hidden states: 7 tokens, then 5 more over the cached 7."""
    from transformers import DeepseekV2ForCausalLM as HFModel

    cfg = _config(q_lora_rank, rope, attention_bias=True)
    torch.manual_seed(0)
    hf = HFModel(cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn_like(p) * 0.2 + (1.0 if p.dim() == 1 else 0.0))
    ours = DeepseekV2ForCausalLM(cfg, 64)
    ours.load_weights(hf.state_dict().items())
    n = 12
    x = torch.randn(1, n, cfg.hidden_size)
    with torch.no_grad():
        pe = hf.model.rotary_emb(x, torch.arange(n)[None])
        mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
        want = hf.model.layers[0].self_attn(x, attention_mask=mask, position_embeddings=pe)[0][0]
    pool = KVPool(n + 1, 1, *ours.kv_cache_shape()[:2], torch.float32, shared_kv=True)
    backend = TorchNativeBackend(pool)
    table = torch.arange(1, n + 1, dtype=torch.int32)[None]
    got = []
    for start, end in ((0, 7), (7, n)):
        batch = paged_batch(ForwardMode.EXTEND, table, [0], [start], [end - start], torch.arange(start + 1, end + 1))
        backend.init_forward_metadata(batch)
        with torch.no_grad():
            got.append(ours.layers[0].self_attn.forward(x[0, start:end], batch, backend))
    torch.testing.assert_close(torch.cat(got), want, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name,method", [("deepseek_v2-moe", "greedy"), ("deepseek_v2-moe", "group_limited_greedy"),
                                         ("deepseek_v3", None)])
def test_moe_block_matches_transformers(name, method):
    """Routing (softmax greedy / group-limited, V3's biased sigmoid groups), routed scaling and
    the shared experts, on 64 random tokens."""
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Moe
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

    cls, kw = FAMILIES[name]()
    cfg = cls(**(kw if method is None else dict(kw, topk_method=method)))
    torch.manual_seed(1)
    hf = (DeepseekV3MoE if method is None else DeepseekV2Moe)(cfg).eval()
    state = {k: torch.randn_like(v) * 0.3 for k, v in hf.state_dict().items()}
    hf.load_state_dict(state)
    ours = DeepseekMoE(cfg, TorchOps, v3=method is None)
    prefix = "shared_experts."
    shared = {prefix + "gate_up_proj.weight": torch.cat([state.pop(prefix + "gate_proj.weight"),
                                                         state.pop(prefix + "up_proj.weight")])}
    ours.load_state_dict(dict(state, **shared))
    x = torch.randn(64, cfg.hidden_size)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), hf(x), atol=1e-5, rtol=1e-4)


def test_tensor_parallelism_is_refused():
    cfg = _config(24)
    with pytest.raises(ValueError, match="tensor parallelism with multi-head latent attention"):
        DeepseekV2ForCausalLM(cfg, 64, layout=TPLayout.of(cfg, 0, 2))


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_quantized_mla_serves(tmp_path, smol_dir, monkeypatch, method):
    """Weight-quantized linear layers in the latent attention (q_lora_rank 32: every input width
    a multiple of int4's group); the absorbed W_UK/W_UV stay in the model's dtype."""
    monkeypatch.setenv("RADIXSERVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(FAMILIES, "mla-q32", lambda: (FAMILIES["deepseek_v2"]()[0],
                                                      dict(FAMILIES["deepseek_v2"]()[1], q_lora_rank=32)))
    path = str(tmp_path / "dsv2")
    build_family("mla-q32", path, smol_dir)
    eng = make_engine(path, dtype="bfloat16", quantization=method, max_total_tokens=512)
    attn = eng.runner.model.layers[0].self_attn
    assert isinstance(attn.q_b_proj, QuantLinear) and isinstance(attn.o_proj, QuantLinear)
    assert attn.w_uk.dtype == attn.w_uv.dtype == torch.bfloat16
    sp = {"max_new_tokens": 8, "temperature": 0}
    a = eng.generate(input_ids=list(range(300, 340)), sampling_params=sp)["output_ids"]
    assert len(a) == 8 and a == eng.generate(input_ids=list(range(300, 340)), sampling_params=sp)["output_ids"]
    eng.check_invariants()
