"""The sparse mixture-of-experts block (radixserve/model/layers/moe.py) against transformers 5.25's
blocks, and the MoE families' loading and limits (model/layers/moe_decoder.py, model/arch/mixtral.py, model/arch/qwen_moe.py).  Whole models against
transformers: test_families.py ("mixtral", "qwen2_moe", "qwen3_moe" in tests/helpers/families.py)."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file
from torch.utils._python_dispatch import TorchDispatchMode

from radixserve.model.layers.moe import DenseProjection, Experts, Routing, SparseMoE, route
from tests.helpers.families import FAMILIES, build_family

H, E, INTER, SHARED = 64, 8, 32, 48
MOE_FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe")


def _hf_block(kind: str, top_k: int, norm: bool, impl: str):
    """transformers' block of ``kind`` (random weights, std 0.3) and our SparseMoE holding them."""
    from transformers import MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    qwen = dict(hidden_size=H, moe_intermediate_size=INTER, num_experts=E, num_experts_per_tok=top_k,
                norm_topk_prob=norm)
    shared = SHARED if kind == "qwen2_moe" else 0
    if kind == "mixtral":
        cfg = MixtralConfig(hidden_size=H, intermediate_size=INTER, num_local_experts=E, num_experts_per_tok=top_k)
        cls, routing = MixtralSparseMoeBlock, Routing(top_k, True, True)
    elif kind == "qwen2_moe":
        cfg = Qwen2MoeConfig(**qwen, shared_expert_intermediate_size=SHARED)
        cls, routing = Qwen2MoeSparseMoeBlock, Routing(top_k, norm, False)
    else:
        cfg, cls, routing = Qwen3MoeConfig(**qwen), Qwen3MoeSparseMoeBlock, Routing(top_k, norm, False)
    cfg._experts_implementation = impl
    torch.manual_seed(0)
    ref = cls(cfg).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0, 0.3)
    state = ref.state_dict()
    if shared:
        state["shared_expert.gate_up_proj.weight"] = torch.cat([state.pop("shared_expert.gate_proj.weight"),
                                                                state.pop("shared_expert.up_proj.weight")])
    ours = SparseMoE(H, E, INTER, routing, shared_intermediate=shared)
    ours.load_state_dict(state, strict=True)
    return ref, ours


def _compare(ref, ours, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        return ref(x[None])[0], ours(x)


BLOCKS = [("mixtral", 2, True), ("mixtral", 4, True), ("qwen2_moe", 2, False), ("qwen2_moe", 4, True),
          ("qwen3_moe", 4, True), ("qwen3_moe", 2, False)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind,top_k,norm", BLOCKS)
def test_block_equals_transformers_grouped_mm(kind, top_k, norm, dtype):
    """Bit for bit what transformers' models run (their default experts path, ``grouped_mm``),
    on many tokens (every expert hit)."""
    ref, ours = _hf_block(kind, top_k, norm, "grouped_mm")
    ref, ours = ref.to(dtype), ours.to(dtype)
    x = torch.randn(257, H).to(dtype)
    assert bool((route(ours.gate(x), ours.routing)[1].flatten().bincount(minlength=E) > 0).all())
    want, got = _compare(ref, ours, x)
    assert got.dtype == dtype
    if kind == "qwen2_moe" and dtype == torch.float32:
        # the shared expert is a GatedMLP: SiLU runs on the fused gate_up's strided half, which
        # rounds a few ulps apart from transformers' contiguous gate_proj output
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    else:
        assert torch.equal(got, want)


@pytest.mark.parametrize("kind,top_k,norm", BLOCKS)
def test_block_matches_transformers_eager_in_fp32(kind, top_k, norm):
    """transformers' eager loop adds each expert's output in turn: the same sums, other rounding."""
    ref, ours = _hf_block(kind, top_k, norm, "eager")
    want, got = _compare(ref, ours, torch.randn(200, H))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", MOE_FAMILIES)
def test_experts_without_tokens_and_tiny_batches(kind):
    ref, ours = _hf_block(kind, 2, True, "grouped_mm")
    with torch.no_grad():
        for block in (ref, ours):  # on positive inputs, experts 0 and 5 are never picked
            block.gate.weight[[0, 5]] = -1.0
    for n in (1, 3, 40):
        x = torch.randn(n, H).abs()
        hit = route(ours.gate(x), ours.routing)[1].flatten().bincount(minlength=E)
        assert hit[0] == hit[5] == 0
        want, got = _compare(ref, ours, x)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert ours(torch.randn(0, H)).shape == (0, H)


@pytest.mark.parametrize("norm", [True, False])
def test_routing_flags_and_weight_dtypes_match_transformers_routers(norm):
    from transformers import MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeTopKRouter
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    qwen = dict(hidden_size=H, num_experts=E, num_experts_per_tok=3, norm_topk_prob=norm)
    routers = [(MixtralTopKRouter(MixtralConfig(hidden_size=H, num_local_experts=E, num_experts_per_tok=3)),
                Routing(3, True, True)),
               (Qwen2MoeTopKRouter(Qwen2MoeConfig(**qwen)), Routing(3, norm, False)),
               (Qwen3MoeTopKRouter(Qwen3MoeConfig(**qwen)), Routing(3, norm, False))]
    x = torch.randn(50, H).bfloat16()
    for ref, routing in routers:
        with torch.no_grad():
            ref.weight.normal_(0, 0.1)  # soft routing: the top-3 alone sum well below 1
            _, want_w, want_idx = ref.bfloat16()(x)
        got_w, got_idx = route(torch.nn.functional.linear(x, ref.weight), routing)
        assert torch.equal(got_idx, want_idx) and torch.equal(got_w, want_w)
        assert got_w.dtype == (torch.float32 if routing.fp32_weights else torch.bfloat16)
        sums = got_w.float().sum(-1)
        assert bool((sums - 1).abs().max() < 1e-2) == routing.norm_topk_prob


class _GemmCount(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("tokens", [1, 64, 512])
def test_grouped_experts_run_one_gemm_pair_per_expert_with_tokens(tokens):
    torch.manual_seed(tokens)
    experts = Experts(E, H, INTER, lambda gu: torch.nn.functional.silu(gu[:, :INTER]) * gu[:, INTER:])
    torch.nn.init.normal_(experts.gate_up_proj)
    torch.nn.init.normal_(experts.down_proj)
    x = torch.randn(tokens, H)
    weights, ids = torch.softmax(torch.randn(tokens, E), -1).topk(2)
    with _GemmCount() as count:
        out = experts(x, weights, ids)
    assert count.n == 2 * len(ids.unique())  # gate_up + down per expert hit, whatever the token count
    torch.testing.assert_close(out, _per_token(experts, x, weights, ids), rtol=1e-4, atol=1e-4)


def _per_token(experts: Experts, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The definition, one token and expert at a time."""
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j, e in enumerate(ids[t].tolist()):
            gate, up = (experts.gate_up_proj[e] @ x[t]).chunk(2)
            out[t] += weights[t, j] * (experts.down_proj[e] @ (torch.nn.functional.silu(gate) * up))
    return out


# ---------------------------------------------------------------------- the families: loading and limits
def _config(name: str, **over):
    cls, kw = FAMILIES[name]()
    return cls(**{**kw, **over})


def _load(path) -> torch.nn.Module:
    from radixserve.model import loader

    return loader.load_model(loader.load_config(str(path)), str(path), torch.float32, torch.device("cpu"), 256)


@pytest.mark.parametrize("name", MOE_FAMILIES)
def test_per_expert_and_fused_checkpoints_load_the_same_weights(name, tmp_path):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(_config(name)).eval()
    hf.save_pretrained(tmp_path / "per_expert")  # transformers 5.25 writes the published per-expert names
    with safe_open(str(tmp_path / "per_expert" / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    one = "block_sparse_moe.experts.7.w3.weight" if name == "mixtral" else "mlp.experts.7.up_proj.weight"
    assert f"model.layers.0.{one}" in keys and not any(k.endswith("experts.gate_up_proj") for k in keys)
    # the fused layout: transformers' in-memory names and [E, 2I, H] / [E, H, I] tensors
    hf.config.save_pretrained(tmp_path / "fused")
    tied = hf.config.tie_word_embeddings
    save_file({k: v.contiguous() for k, v in hf.state_dict().items() if not (tied and k == "lm_head.weight")},
              str(tmp_path / "fused" / "model.safetensors"))
    a, b = _load(tmp_path / "per_expert").state_dict(), _load(tmp_path / "fused").state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    experts = hf.model.layers[2].mlp.experts
    assert torch.equal(a["layers.2.mlp.experts.gate_up_proj"], experts.gate_up_proj)
    assert torch.equal(a["layers.2.mlp.experts.down_proj"], experts.down_proj)


def test_a_missing_expert_is_named(tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_config(_config("qwen3_moe")).save_pretrained(tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    del tensors["model.layers.1.mlp.experts.3.up_proj.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"missing weights.*layers\.1\.mlp\.experts\.gate_up_proj"):
        _load(tmp_path)


@pytest.mark.parametrize("name", MOE_FAMILIES)
def test_layers_are_sparse_or_dense_as_configured_and_never_native(name):
    from radixserve.model.layers.norm_mlp import GatedMLP
    from radixserve.model.registry import model_class
    from radixserve.parallel.layout import TPLayout

    cfg = _config(name)
    model = model_class(cfg)(cfg, 64)
    assert model.native_layers is False
    kinds = [type(layer.mlp) for layer in model.layers]
    assert kinds == ([SparseMoE, GatedMLP, SparseMoE] if name == "qwen2_moe" else [SparseMoE] * 3)
    assert (model.layers[0].mlp.shared_expert is not None) == (name == "qwen2_moe")
    with pytest.raises(ValueError, match="tensor parallelism with mixture-of-experts"):
        model_class(cfg)(cfg, 64, layout=TPLayout.of(cfg, 0, 2))
    if name == "qwen3_moe":  # Qwen's other rule: every decoder_sparse_step-th layer is sparse
        sparse_every_2 = _config(name, decoder_sparse_step=2)
        assert [type(layer.mlp) for layer in model_class(sparse_every_2)(sparse_every_2, 64).layers] == [
            GatedMLP, SparseMoE, GatedMLP]
        with pytest.raises(ValueError, match="qwen3_moe with attention_bias"):
            model_class(_config(name, attention_bias=True))


def test_int8_quantizes_dense_layers_and_keeps_router_and_experts_dense(tmp_path, smol_dir, monkeypatch):
    from radixserve.model.quant.linear import QuantLinear
    from tests.helpers.models import make_engine

    monkeypatch.setenv("RADIXSERVE_CACHE", str(tmp_path / "cache"))
    build_family("qwen2_moe", str(tmp_path / "model"), smol_dir)
    with make_engine(str(tmp_path / "model"), dtype="bfloat16", quantization="int8", max_total_tokens=512) as eng:
        model = eng.runner.model
        quantized = {n for n, m in model.named_modules() if isinstance(m, QuantLinear)}
        assert {"layers.0.self_attn.qkv_proj", "layers.0.mlp.shared_expert.gate_up_proj",
                "layers.1.mlp.gate_up_proj"} <= quantized
        moe = model.layers[0].mlp
        assert isinstance(moe.gate, DenseProjection) and isinstance(moe.shared_expert_gate, DenseProjection)
        assert moe.experts.gate_up_proj.dtype == moe.experts.down_proj.dtype == torch.bfloat16
        sp = {"max_new_tokens": 8, "temperature": 0}
        out = [eng.generate(input_ids=list(range(300, 340)), sampling_params=sp)["output_ids"] for _ in range(2)]
        assert len(out[0]) == 8 and out[0] == out[1]
