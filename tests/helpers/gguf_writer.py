"""Write a Hugging Face checkpoint as a GGUF file the way llama.cpp's ``convert_hf_to_gguf.py``
does, so that tests can check what radixserve reads back from a user's GGUF file.

``write_gguf(hf_dir, path, qtype)`` mirrors the converter for each family: the architecture
name (``gguf.MODEL_ARCH``: Llama, Mistral and Mixtral are all ``llama``), its metadata keys
(tests/helpers/gguf_metadata.py), tensor names through ``gguf.get_tensor_name_map`` and the converter's tensor
rewrites: Llama's q/k row permutation, Gemma's ``norm + 1``, experts stacked into 3-D
``ffn_*_exps``, Phi-3's LongRoPE and Llama 3.1's rope factors as tensors, DeepSeek-V2's
``kv_b_proj`` split into ``attn_k_b`` (transposed) and ``attn_v_b`` with MQA metadata.  The
tokenizer goes in as llama.cpp's GPT-2 BPE vocabulary (``tokenizer.ggml.*``, merges, special
ids and ``tokenizer.chat_template`` through ``gguf.SpecialVocab``).  Weights are F32, or
``qtype`` (e.g. Q8_0, through ``gguf.quants``) for the matrices llama.cpp quantizes.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Iterator

import gguf
import numpy as np
import torch

from tests.helpers.gguf_metadata import write_metadata

# HF model_type -> llama.cpp architecture
ARCH = {"llama": "llama", "mistral": "llama", "mixtral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "phi3": "phi3",
        "gemma2": "gemma2", "gemma3_text": "gemma3", "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe",
        "deepseek_v2": "deepseek2"}
PERMUTED = ("llama", "mistral", "mixtral")  # LlamaModel.modify_tensors permutes q/k rows
EXPERT_TENSOR = {"w1": gguf.MODEL_TENSOR.FFN_GATE_EXP, "gate_proj": gguf.MODEL_TENSOR.FFN_GATE_EXP,
                 "w3": gguf.MODEL_TENSOR.FFN_UP_EXP, "up_proj": gguf.MODEL_TENSOR.FFN_UP_EXP,
                 "w2": gguf.MODEL_TENSOR.FFN_DOWN_EXP, "down_proj": gguf.MODEL_TENSOR.FFN_DOWN_EXP}
EXPERT = re.compile(r"model\.layers\.(\d+)\.(?:block_sparse_moe|mlp)\.experts\.(\d+)\.(\w+)\.weight")
SMOLLM_PRE = "smollm"  # tokenizer.ggml.pre llama.cpp's hash table gives SmolLM2's tokenizer


def llama_cpp_semantics(hf_dir: str) -> Any:
    """Rewrite ``hf_dir``'s config to what llama.cpp's GGUF can say, return that transformers
    model: llama.cpp stores no query scale for Gemma (it runs 1/sqrt(head_dim), or
    1/sqrt(hidden/heads) for the 27B models), Gemma 3's sliding layers are five in six, and
    DeepSeek-V2's YaRN ``mscale`` is taken as ``mscale_all_dim`` (only the latter is stored)."""
    from transformers import AutoModelForCausalLM

    path = Path(hf_dir) / "config.json"
    cfg = json.loads(path.read_text())
    if cfg["model_type"].startswith("gemma"):
        big = cfg["num_hidden_layers"] in (46, 62)
        cfg["query_pre_attn_scalar"] = cfg["hidden_size"] // cfg["num_attention_heads"] if big else cfg["head_dim"]
    if cfg["model_type"] == "gemma3_text":
        cfg["sliding_window_pattern"] = 6
        cfg["layer_types"] = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                              for i in range(cfg["num_hidden_layers"])]
    rope = cfg.get("rope_parameters") or {}
    if rope.get("mscale_all_dim"):
        rope["mscale"] = rope["mscale_all_dim"]
    path.write_text(json.dumps(cfg, indent=2))
    return AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()


# path -> (architecture, {tensor name: F32 data as written}, {metadata key: value}) of each file
# write_gguf wrote: what a test checks of the layout without parsing the file's vocabulary again
WRITTEN: dict[str, tuple[str, dict[str, np.ndarray], dict[str, Any]]] = {}


def write_gguf(hf_dir: str, path: str, qtype: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32) -> str:
    """Write ``hf_dir`` (config, safetensors, tokenizer) as the GGUF ``path``; return ``path``
    (recorded in ``WRITTEN``)."""
    from safetensors.torch import load_file
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(hf_dir)
    hparams = json.loads((Path(hf_dir) / "config.json").read_text())
    arch = ARCH[cfg.model_type]
    w = gguf.GGUFWriter(path, arch)
    w.add_name(Path(hf_dir).name)
    write_metadata(w, arch, cfg, hparams)
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if qtype == gguf.GGMLQuantizationType.F32
                    else gguf.LlamaFileType[f"MOSTLY_{qtype.name}"])
    _vocab(w, hf_dir, cfg.vocab_size)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], cfg.num_hidden_layers)
    tensors = load_file(str(Path(hf_dir) / "model.safetensors"))
    written: dict[str, np.ndarray] = {}
    for name, t in _llama_cpp_tensors(cfg, tensors):
        new = name if name.startswith(("blk.", "rope_")) else names.get_name(name, try_suffixes=(".weight", ".bias"))
        if new is None:  # as llama.cpp: e.g. Qwen2-MoE's dense layers (mlp_only_layers)
            raise ValueError(f"Can not map tensor {name!r}")
        written[new] = t.float().numpy()
        _add_tensor(w, new, written[new], qtype)
    fields = {k: v.value for kv in w.kv_data for k, v in kv.items() if not k.startswith("tokenizer.ggml.")}
    WRITTEN[path] = (arch, written, fields)
    return finish(w, path)


def finish(w: gguf.GGUFWriter, path: str) -> str:
    """Write the header, metadata and tensors of ``w`` to its file ``path``; return ``path``."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _add_tensor(w: gguf.GGUFWriter, name: str, data: np.ndarray, qtype: gguf.GGMLQuantizationType) -> None:
    """F32 for what llama.cpp keeps in F32 (vectors, norms, routers), else ``qtype``."""
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    keep = (data.ndim <= 1 or name.endswith("_norm.weight") or ".ffn_gate_inp" in name
            or data.shape[-1] % block != 0)
    if qtype == gguf.GGMLQuantizationType.F32 or keep:
        w.add_tensor(name, np.ascontiguousarray(data, dtype=np.float32))
    else:
        w.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)


def permute(t: torch.Tensor, n_head: int) -> torch.Tensor:
    """LlamaModel.permute: rotary pairs from HF's half split to llama.cpp's interleaving."""
    return t.reshape(n_head, 2, t.shape[0] // n_head // 2, *t.shape[1:]).swapaxes(1, 2).reshape(t.shape)


def _llama_cpp_tensors(cfg: Any, tensors: dict[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF or GGUF name, tensor) after the converter's ``modify_tensors`` of ``cfg``'s family."""
    mt = cfg.model_type
    experts: dict[tuple[int, str], dict[int, torch.Tensor]] = {}
    for name, t in tensors.items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        if mt in PERMUTED and name.endswith(("q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias")):
            t = permute(t, cfg.num_attention_heads if ".q_proj." in name else cfg.num_key_value_heads)
        if mt.startswith("gemma") and name.endswith("norm.weight"):
            t = t + 1
        if m := EXPERT.fullmatch(name):
            experts.setdefault((int(m[1]), m[3]), {})[int(m[2])] = t
        elif name.endswith("kv_b_proj.weight"):  # DeepSeek-V2: MLA absorption wants k_b and v_b apart
            nope, v = cfg.qk_nope_head_dim, cfg.v_head_dim
            k_b, v_b = t.view(cfg.num_attention_heads, nope + v, t.shape[-1]).split([nope, v], dim=1)
            yield name.replace("kv_b_proj", "k_b_proj"), k_b.transpose(1, 2)
            yield name.replace("kv_b_proj", "v_b_proj"), v_b
        else:
            yield name, t
    for (bid, w), parts in sorted(experts.items()):
        stacked = torch.stack([parts[i] for i in range(len(parts))])
        yield gguf.TENSOR_NAMES[EXPERT_TENSOR[w]].format(bid=bid) + ".weight", stacked
    yield from _rope_factors(cfg)


def _rope_factors(cfg: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """Phi-3's LongRoPE factors and Llama 3.1's frequency factors, which llama.cpp stores as tensors."""
    rope = getattr(cfg, "rope_parameters", None) or {}
    if rope.get("rope_type") == "llama3":  # LlamaModel.generate_extra_tensors, independently of radixserve's
        dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        freqs = 1.0 / (rope["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        old, factor = rope["original_max_position_embeddings"], rope["factor"]
        low, high = rope["low_freq_factor"], rope["high_freq_factor"]
        smooth = (old / (2 * math.pi / freqs) - low) / (high - low)
        factors = torch.where(2 * math.pi / freqs < old / high, 1.0, torch.where(
            2 * math.pi / freqs > old / low, factor, 1 / ((1 - smooth) / factor + smooth)))
        yield gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight", factors.float()
    if cfg.model_type == "phi3" and rope.get("rope_type") == "longrope":
        yield gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FACTORS_LONG] + ".weight", torch.tensor(rope["long_factor"])
        yield gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FACTORS_SHORT] + ".weight", torch.tensor(rope["short_factor"])


def _vocab(w: gguf.GGUFWriter, hf_dir: str, vocab_size: int) -> None:
    """llama.cpp's ``_set_vocab_gpt2``: tokens with their types, then merges, special ids and
    the chat template from the tokenizer files."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(hf_dir)
    reverse = {i: t for t, i in tok.get_vocab().items()}
    added = tok.get_added_vocab()
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        t = reverse[i]
        tokens.append(t)
        if t not in added:
            types.append(gguf.TokenType.NORMAL)
        elif tok.added_tokens_decoder[i].special or (t.startswith("<|") and t.endswith("|>")):
            types.append(gguf.TokenType.CONTROL)
        else:
            types.append(gguf.TokenType.USER_DEFINED)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(SMOLLM_PRE)
    w.add_token_list(tokens)
    w.add_token_types(types)
    gguf.SpecialVocab(hf_dir, load_merges=True, n_vocab=len(tokens)).add_to_gguf(w)
