"""Random-weight checkpoints in the shapes of real models, written as GGUF files, for bench_scale.py.

Every peer of the scale benchmark starts from the same file, as bench_peers does with SmolLM2:
llama.cpp reads it as is, radixserve converts it once to a Hugging Face directory
(``model.loader.resolve_hf_dir``) that HF transformers and vLLM then load, so all of them run
exactly the same weights (the dequantized values of the file).

The tensors are written straight into the GGUF file, one at a time, never as a transformers
model: an 8B checkpoint would need 32 GB in fp32.  Names and shapes come from transformers'
model class built on the meta device; the metadata and the vocabulary are what llama.cpp's
converter writes (tests/helpers/gguf_metadata.py, gguf_writer.py), the vocabulary being
SmolLM2's tokenizer padded with unused ``[PADn]`` tokens up to the shape's vocabulary size.
Values: ``N(0, 0.02)`` for every matrix and the embedding (transformers' ``initializer_range``:
the layers' outputs outweigh the embedding in the residual stream, so the next token depends on
the whole context), ones for the norms, zeros for biases.
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from radixserve.model.loader import cache_root, default_model_path, resolve_hf_dir


@dataclass(frozen=True)
class Shape:
    """One model shape: its transformers family, its sizes and the published model it copies."""

    name: str
    like: str
    model_type: str
    sizes: dict[str, Any] = field(default_factory=dict)

    def config(self) -> Any:
        from transformers import AutoConfig

        return AutoConfig.for_model(self.model_type, **self.sizes)


SHAPES = {s.name: s for s in (
    Shape("0.3b", "a 0.3B Llama (SmolLM2's vocabulary)", "llama", dict(
        vocab_size=49152, hidden_size=1024, intermediate_size=2816, num_hidden_layers=24, num_attention_heads=16,
        num_key_value_heads=4, head_dim=64, max_position_embeddings=32768, rope_theta=100000.0,
        tie_word_embeddings=True)),
    Shape("1.5b", "Qwen2.5-1.5B", "qwen2", dict(
        vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True)),
    Shape("8b", "Llama-3-8B", "llama", dict(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, max_position_embeddings=32768, rope_theta=500000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=False)),
)}


def hf_shapes(config: Any) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor of ``config``'s transformers model (built on the meta device)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return {n: tuple(p.shape) for n, p in model.state_dict().items()
            if not (n == "lm_head.weight" and config.tie_word_embeddings)}


def param_count(config: Any) -> int:
    """Parameters of the shape (a tied LM head counted once)."""
    return int(sum(np.prod(s) for s in hf_shapes(config).values()))


def random_tensor(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if name.endswith("norm.weight"):
        return np.ones(shape, dtype=np.float32)
    if name.endswith(".bias"):
        return np.zeros(shape, dtype=np.float32)
    return rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)


def write_random_gguf(shape: Shape, path: str, qtype: str = "Q4_1", seed: int = 0) -> str:
    """Write ``shape`` with random weights as the GGUF ``path`` (matrices in ``qtype``)."""
    import gguf
    from transformers import AutoTokenizer

    from tests.helpers.gguf_metadata import write_metadata
    from tests.helpers.gguf_writer import ARCH, _add_tensor, _vocab, finish

    config = shape.config()
    arch = ARCH[config.model_type]
    quant = gguf.GGMLQuantizationType[qtype]
    with tempfile.TemporaryDirectory() as meta_dir:  # config + tokenizer: what the writer reads
        AutoTokenizer.from_pretrained(resolve_hf_dir(default_model_path())).save_pretrained(meta_dir)
        config.save_pretrained(meta_dir)
        w = gguf.GGUFWriter(path, arch)
        w.add_name(f"random-{shape.name}")
        write_metadata(w, arch, config, json.loads((Path(meta_dir) / "config.json").read_text()))
        w.add_file_type(gguf.LlamaFileType[f"MOSTLY_{qtype}"])
        _vocab(w, meta_dir, config.vocab_size)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], config.num_hidden_layers)
    rng = np.random.default_rng(seed)
    for name, dims in hf_shapes(config).items():
        new = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if new is None:
            raise ValueError(f"{shape.name}: no GGUF name for {name}")
        _add_tensor(w, new, random_tensor(name, dims, rng), quant)
    return finish(w, path)


def checkpoint(name: str, qtype: str = "Q4_1") -> str:
    """The GGUF file of shape ``name``, written once under the cache (``$RADIXSERVE_CACHE/scale``)."""
    shape = SHAPES[name]
    folder = os.path.join(cache_root(), "scale")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"random-{name}.{qtype}.gguf")
    if not os.path.exists(path):
        tmp = path + ".part.gguf"
        write_random_gguf(shape, tmp, qtype)
        os.replace(tmp, path)
    return path
