"""A user's GGUF files of every family: the tiny checkpoints of tests/helpers/families.py written
as llama.cpp's convert_hf_to_gguf.py writes them (tests/helpers/gguf_writer.py), loaded by
radixserve through its GGUF conversion (radixserve/model/gguf/convert.py).  F32 files give
transformers' greedy tokens and prompt logprobs on the original checkpoint; a Q8_0 file's
agreement is reported; the chat template survives; files radixserve cannot read raise a
ValueError naming the architecture and GGUF."""
from __future__ import annotations

import asyncio
from unittest import mock

import gguf
import numpy as np
import pytest

from tests.helpers.families import FAMILIES, WINDOW, build_family
from tests.helpers.gguf_writer import ARCH, WRITTEN, finish, llama_cpp_semantics, permute, write_gguf
from tests.helpers.models import hf_greedy, hf_prompt_logprobs, make_engine

GGUF_FAMILIES = ("llama", "llama3_rope", "qwen2", "qwen3", "phi3", "gemma2", "gemma3", "mixtral", "qwen2_moe", "qwen3_moe",
                 "deepseek_v2")
# (family, config changes): llama.cpp's qwen2moe has experts in every layer (its converter cannot
# map Qwen2-MoE's dense layers); Llama 3.1's rope goes into a GGUF as a rope_freqs tensor
VARIANTS = {"qwen2_moe": ("qwen2_moe", {"mlp_only_layers": []}),
            "llama3_rope": ("llama", {"rope_parameters": {
                "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})}
GEN = {"max_new_tokens": 16, "temperature": 0}
PROMPTS = [list(range(300 + 7 * i, 300 + 7 * i + n)) for i, n in enumerate((5, 3 * WINDOW + 5, 130))]
F32, Q8_0 = gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.Q8_0
# not the model's: bookkeeping, and the special ids (a GGUF carries the tokenizer's)
NOT_MODEL = {"dtype", "architectures", "_name_or_path", "transformers_version", "bos_token_id", "eos_token_id",
             "pad_token_id", "unk_token_id"}


@pytest.fixture(scope="module")
def gguf_cache(smol_dir, tmp_path_factory):
    """Converted directories go to a temporary $RADIXSERVE_CACHE (SmolLM2's stays where it is)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("RADIXSERVE_CACHE", str(tmp_path_factory.mktemp("radixserve_cache")))
    yield
    mp.undo()


_WRITTEN_FAMILIES: dict[tuple[str, str], tuple] = {}  # (name, qtype) -> _family_gguf's answer, per session


def _family_gguf(name: str, tmp_path_factory, smol_dir: str, qtype: gguf.GGMLQuantizationType = F32):
    """(HF dir, transformers model, GGUF path) of family ``name`` (or a ``VARIANTS`` one),
    written once per session (the files are only read)."""
    key = (name, qtype.name)
    if key not in _WRITTEN_FAMILIES:
        _WRITTEN_FAMILIES[key] = _write_family_gguf(name, tmp_path_factory, smol_dir, qtype)
    return _WRITTEN_FAMILIES[key]


def _write_family_gguf(name: str, tmp_path_factory, smol_dir: str, qtype: gguf.GGMLQuantizationType):
    hf_dir = str(tmp_path_factory.mktemp(name))
    base, changes = VARIANTS.get(name, (name, {}))
    cls, kw = FAMILIES[base]()
    with mock.patch.dict(FAMILIES, {base: lambda: (cls, {**kw, **changes})}):
        build_family(base, hf_dir, smol_dir)
    hf = llama_cpp_semantics(hf_dir)
    path = write_gguf(hf_dir, str(tmp_path_factory.mktemp(f"{name}_gguf") / f"{name}-{qtype.name}.gguf"), qtype)
    return hf_dir, hf, path


@pytest.fixture(scope="module", params=GGUF_FAMILIES)
def family(request, tmp_path_factory, smol_dir, gguf_cache):
    return (request.param, *_family_gguf(request.param, tmp_path_factory, smol_dir))


def test_gguf_greedy_and_logprobs_match_transformers(family):
    from transformers import AutoConfig

    name, _, hf, path = family
    eng = make_engine(path, max_total_tokens=2048)
    want, got_cfg = hf.config.to_dict(), AutoConfig.from_pretrained(eng.model_path).to_dict()
    assert {k: (v, got_cfg.get(k)) for k, v in want.items()
            if k not in NOT_MODEL and v is not None and got_cfg.get(k) != v} == {}, name
    got = [o["output_ids"] for o in eng.generate(input_ids=PROMPTS, sampling_params=GEN)]
    assert got == [hf_greedy(hf, p, GEN["max_new_tokens"]) for p in PROMPTS], name
    out = eng.generate(input_ids=PROMPTS[2], sampling_params={"max_new_tokens": 1}, return_logprob=True,
                       logprob_start_len=0)
    lp = [t[0] for t in out["meta_info"]["input_token_logprobs"][1:]]
    assert max(abs(a - b) for a, b in zip(lp, hf_prompt_logprobs(hf, PROMPTS[2]), strict=True)) < 1e-4, name


def test_gguf_files_have_llama_cpp_layout(family):
    """What the helper writes is llama.cpp's layout, so the round trip above reads that layout
    (checked on what ``write_gguf`` put in the file: ``WRITTEN``)."""
    name, _, hf, path = family
    arch, t, fields = WRITTEN[path]
    assert arch == ARCH[hf.config.model_type] and fields["general.architecture"] == arch
    sd = {k.removeprefix("model."): v for k, v in hf.state_dict().items()}
    if name.startswith("llama"):  # q/k rows: rotary pairs interleaved, not HF's halves
        q, hf_q = t["blk.0.attn_q.weight"], sd["layers.0.self_attn.q_proj.weight"]
        assert np.allclose(q, permute(hf_q, hf.config.num_attention_heads).numpy()) and not np.allclose(q, hf_q)
    if name.startswith("gemma"):  # Gemma's 1 + w norms are stored as 1 + w
        assert np.allclose(t["blk.0.attn_norm.weight"], sd["layers.0.input_layernorm.weight"].numpy() + 1)
    if name in ("mixtral", "qwen2_moe", "qwen3_moe"):  # stacked experts [E, I, H]
        e = getattr(hf.config, "num_local_experts", None) or hf.config.num_experts
        assert t["blk.0.ffn_gate_exps.weight"].shape[0] == e
    if name == "llama3_rope":
        assert "rope_freqs.weight" in t
    if name == "phi3":
        assert {"rope_factors_long.weight", "blk.0.attn_qkv.weight", "blk.0.ffn_up.weight"} <= set(t)
    if name == "deepseek_v2":  # MLA as MQA, kv_b split for absorption
        assert {"blk.0.attn_k_b.weight", "blk.0.attn_v_b.weight"} <= set(t) and "blk.0.attn_kv_b.weight" not in t
        assert fields["deepseek2.attention.head_count_kv"] == 1


def test_q8_0_gguf_agrees_with_transformers(tmp_path_factory, smol_dir, gguf_cache):
    _, hf, path = _family_gguf("llama", tmp_path_factory, smol_dir, Q8_0)
    assert any(x.tensor_type == Q8_0 for x in gguf.GGUFReader(path).tensors)
    eng = make_engine(path, max_total_tokens=2048)
    got = [o["output_ids"] for o in eng.generate(input_ids=PROMPTS, sampling_params=GEN)]
    ref = [hf_greedy(hf, p, GEN["max_new_tokens"]) for p in PROMPTS]
    same = sum(a == b for g, r in zip(got, ref) for a, b in zip(g, r)) / sum(map(len, ref))
    print(f"Q8_0 llama: {same:.0%} of greedy tokens equal to transformers' fp32")
    assert same >= 0.9


def test_gguf_keeps_the_chat_template(tmp_path_factory, smol_dir, gguf_cache):
    """The qwen3 GGUF's tokenizer.chat_template renders /v1/chat/completions prompts as the
    original tokenizer config does (the server's ChatEncoder over the converted directory)."""
    from transformers import AutoTokenizer

    from radixserve.model.loader import resolve_hf_dir
    from radixserve.server.openai.chat_encoder import ChatEncoder
    from radixserve.tokenizer import load_hf_tokenizer

    hf_dir, _, path = _family_gguf("qwen3", tmp_path_factory, smol_dir)
    assert "tokenizer.chat_template" in gguf.GGUFReader(path).fields
    orig, conv_dir = AutoTokenizer.from_pretrained(hf_dir), resolve_hf_dir(path)
    conv = load_hf_tokenizer(conv_dir)
    assert conv.chat_template == orig.chat_template and orig.chat_template
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there!"},
                {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "2 + 2?"}]
    got = asyncio.run(ChatEncoder(conv, conv_dir).encode(messages))
    want = orig.encode(orig.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
                       add_special_tokens=False)
    assert got == want


def _tiny_gguf(path: str, arch: str, extra: dict[str, np.ndarray]) -> str:
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(1)
    w.add_rope_dimension_count(8)
    w.add_token_list(["a", "b"])
    for name, data in {"token_embd.weight": np.zeros((2, 8), np.float32), **extra}.items():
        w.add_tensor(name, data)
    return finish(w, path)


@pytest.mark.parametrize("arch,extra,words", [
    ("falcon", {}, ["'falcon'", "not supported"]),
    ("llama", {"rope_freqs.weight": np.array([1, 2, 3, 4], np.float32)}, ["'llama'", "rope_freqs"]),
])
def test_unreadable_gguf_raises_naming_architecture(tmp_path, gguf_cache, arch, extra, words):
    path = _tiny_gguf(str(tmp_path / f"{arch}.gguf"), arch, extra)
    with pytest.raises(ValueError, match="GGUF") as e:
        make_engine(path)
    assert all(w in str(e.value) for w in words), str(e.value)
