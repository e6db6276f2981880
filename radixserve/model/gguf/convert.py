"""A GGUF file (as llama.cpp's ``convert_hf_to_gguf.py`` writes it) -> a Hugging Face directory.

``convert_gguf(path, out_dir)`` writes ``config.json`` (``gguf/config.py``'s ``hf_config``), the
tokenizer (transformers' GGUF tokenizer: vocabulary, merges, special tokens and
``tokenizer.chat_template``; cached by the hash of those fields, so the quantizations of one
model build it once) and ``model.safetensors`` in the Hugging Face checkpoint layout.
Each tensor is dequantized with ``gguf`` and named through ``gguf.get_tensor_name_map`` against
the transformers model of the config (built on the meta device), then llama.cpp's rewrites are
undone: Llama's q/k row permutation, Gemma's ``norm + 1``, experts stacked as 3-D
``ffn_*_exps``, DeepSeek-V2's ``kv_b_proj`` split into ``attn_k_b``/``attn_v_b``.  Last,
transformers' ``revert_weight_conversion`` gives the checkpoint names (per-expert tensors).
A tensor missing, left over or misshapen raises ValueError naming the architecture.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from typing import Any, Optional

import numpy as np
import torch

CONFIG_TENSORS = ("rope_factors_long.weight", "rope_factors_short.weight", "rope_freqs.weight")  # in the config


def convert_gguf(gguf_path: str, out_dir: str, tokenizer_cache: Optional[str] = None) -> None:
    """Write the Hugging Face directory of ``gguf_path`` into the existing ``out_dir``.
    ``tokenizer_cache``: a folder of converted tokenizers by the hash of their GGUF fields (the
    quantizations of one model share theirs; building one from a GGUF takes seconds)."""
    from gguf import dequantize
    from safetensors.torch import save_file

    from radixserve.model.gguf.config import hf_config

    reader = _reader(gguf_path)
    meta = {k: _value(f) for k, f in reader.fields.items()
            if not k.startswith(("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type",
                                 "tokenizer.ggml.scores"))}
    tensors = {t.name: t for t in reader.tensors}
    shapes = {n: tuple(int(d) for d in reversed(t.shape.tolist())) for n, t in tensors.items()}

    def data(name: str) -> np.ndarray:
        t = tensors[name]
        return np.array(dequantize(t.data, t.tensor_type), copy=True).reshape(shapes[name])

    config = hf_config(meta, shapes, data)
    state = hf_tensors(config, meta["general.architecture"], shapes, data)
    config.save_pretrained(out_dir)
    _write_tokenizer(reader, gguf_path, out_dir, tokenizer_cache)
    save_file({k: v.contiguous() for k, v in state.items()}, os.path.join(out_dir, "model.safetensors"))


def _reader(path: str) -> Any:
    """gguf's ``GGUFReader`` over a plain ndarray view of its memory map: numpy's ``memmap``
    subclass costs microseconds per slice and a 49k-token vocabulary is a million slices
    (SmolLM2's file: 2.1 s -> 0.7 s on the development machine); the map stays open as the
    view's base."""
    from gguf import GGUFReader

    class Reader(GGUFReader):
        @property
        def data(self) -> np.ndarray:
            return self._data

        @data.setter
        def data(self, value: np.ndarray) -> None:
            self._data = np.asarray(value)

    return Reader(path)


def _write_tokenizer(reader: Any, gguf_path: str, out_dir: str, cache: Optional[str]) -> None:
    """transformers' GGUF tokenizer of ``gguf_path`` saved into ``out_dir`` (from ``cache`` when a
    file with the same ``tokenizer.*`` fields was converted before)."""
    from transformers import PreTrainedTokenizerFast

    folder, fname = os.path.split(gguf_path)
    if not cache:
        PreTrainedTokenizerFast.from_pretrained(folder or ".", gguf_file=fname).save_pretrained(out_dir)
        return
    digest = hashlib.sha256()
    for key in sorted(k for k in reader.fields if k.startswith("tokenizer.")):
        field = reader.fields[key]
        digest.update(key.encode())
        for i in field.data:
            digest.update(field.parts[i].tobytes())
    entry = os.path.join(cache, digest.hexdigest()[:32])
    if not os.path.exists(os.path.join(entry, "done")):
        os.makedirs(cache, exist_ok=True)
        tmp = tempfile.mkdtemp(dir=cache)
        PreTrainedTokenizerFast.from_pretrained(folder or ".", gguf_file=fname).save_pretrained(tmp)
        open(os.path.join(tmp, "done"), "w").close()
        try:
            os.rename(tmp, entry)
        except OSError:  # another process cached it first
            shutil.rmtree(tmp, ignore_errors=True)
    for f in os.listdir(entry):
        if f != "done":
            shutil.copy(os.path.join(entry, f), out_dir)


def _value(field: Any) -> Any:
    """A metadata value; float32 numbers as the shortest decimal that reads back the same
    (1e-06, not 9.99999997e-07: the config the checkpoint had)."""
    from gguf import GGUFValueType

    from radixserve.model.gguf.config import short_float

    v = field.contents()
    if field.types and field.types[-1] == GGUFValueType.FLOAT32:
        return [short_float(x) for x in v] if isinstance(v, list) else short_float(v)
    return v


def hf_tensors(config: Any, arch: str, shapes: dict[str, tuple[int, ...]], data) -> dict[str, torch.Tensor]:
    """The checkpoint tensors of ``config``'s model from the GGUF tensors (``data(name)``)."""
    import gguf
    from transformers import AutoModelForCausalLM
    from transformers.core_model_loading import revert_weight_conversion

    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], config.num_hidden_layers)
    state: dict[str, torch.Tensor] = {}
    used: set[str] = set()
    for name, param in skeleton.state_dict().items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        parts = _sources(name, names, shapes)
        if parts is None:
            raise ValueError(f"model: GGUF architecture {arch!r}: no tensor for {name} ({config.model_type})")
        used.update(parts)
        t = _assemble(name, [data(p) for p in parts])
        t = _undo_llama_cpp(name, t, arch, config)
        if tuple(t.shape) != tuple(param.shape):
            if t.numel() != param.numel() or [d for d in t.shape if d != 1] != [d for d in param.shape if d != 1]:
                raise ValueError(f"model: GGUF architecture {arch!r}: {name} has shape {tuple(t.shape)}, "
                                 f"{config.model_type} wants {tuple(param.shape)}")
            t = t.reshape(param.shape)
        state[name] = t
    left = sorted(set(shapes) - used - set(CONFIG_TENSORS))
    if left:
        raise ValueError(f"model: GGUF architecture {arch!r}: tensors {left[:6]} have no place in "
                         f"{config.model_type} (a feature this loader does not read)")
    return revert_weight_conversion(skeleton, state)


def _sources(name: str, names: Any, shapes: dict[str, tuple[int, ...]]) -> list[str] | None:
    """The GGUF tensors that make the transformers tensor ``name``, or None."""
    if name.endswith("mlp.experts.gate_up_proj"):
        bid = name.split(".")[2]
        parts = [f"blk.{bid}.ffn_gate_exps.weight", f"blk.{bid}.ffn_up_exps.weight"]
    else:  # transformers' 3-D expert tensors have no .weight; their GGUF tensors do
        base, suffix = name.rsplit(".", 1) if name.endswith((".weight", ".bias")) else (name, "weight")
        gname = names.get_name(base)
        if gname is None:
            return None
        parts = [f"{gname}.{suffix}"]
        if parts[0] not in shapes and gname.endswith(".attn_kv_b"):  # split by llama.cpp for MLA absorption
            parts = [f"{gname.removesuffix('kv_b')}{kv}.{suffix}" for kv in ("k_b", "v_b")]
    return parts if all(p in shapes for p in parts) else None


def _assemble(name: str, parts: list[np.ndarray]) -> torch.Tensor:
    """One tensor from its GGUF parts: gate and up experts side by side (transformers' fused
    ``gate_up_proj``), DeepSeek's k_b (transposed back) and v_b per head into ``kv_b_proj``."""
    ts = [torch.from_numpy(p) for p in parts]
    if len(ts) == 1:
        return ts[0]
    if "gate_up_proj" in name:
        return torch.cat(ts, dim=1)
    k_b, v_b = ts  # [heads, kv_rank, nope], [heads, v, kv_rank]
    kv_b = torch.cat([k_b.transpose(1, 2), v_b], dim=1)
    return kv_b.reshape(-1, kv_b.shape[-1])


def _undo_llama_cpp(name: str, t: torch.Tensor, arch: str, config: Any) -> torch.Tensor:
    """Undo what llama.cpp's converter did to the tensor ``name`` of architecture ``arch``."""
    if arch == "llama" and (".q_proj." in name or ".k_proj." in name):
        heads = config.num_attention_heads if ".q_proj." in name else config.num_key_value_heads
        return _unpermute(t, heads)
    if arch.startswith("gemma") and name.endswith("norm.weight"):
        return t - 1
    return t


def _unpermute(t: torch.Tensor, heads: int) -> torch.Tensor:
    """Inverse of llama.cpp's ``LlamaModel.permute`` (interleaved rotary pairs -> HF halves)."""
    return t.reshape(heads, t.shape[0] // heads // 2, 2, *t.shape[1:]).swapaxes(1, 2).reshape(t.shape)
