"""What pipeline parallelism refuses at startup (before any rank starts), naming the flag.

The refusals it shares with tensor parallelism (quantization, the draft-model speculative
algorithm, warm restart, the hierarchical cache) are in ``worker/build.check_config``; here:
more stages than layers, a KV pool whose form would have to be measured on the whole model
(``kv_cache_dtype`` other than auto: its accuracy check runs every layer in one process), and
an architecture whose forward is not ``DecoderLM``'s (the stage split lives there).
"""
from __future__ import annotations

from radixserve.config import EngineConfig


def check_pipeline(cfg: EngineConfig) -> None:
    """Raise ValueError naming the flag that pipeline parallelism (``pp_size > 1``) cannot serve."""
    from radixserve.model import loader
    from radixserve.model.layers.decoder import DecoderLM
    from radixserve.model.registry import model_class

    pp = cfg.parallel.pp_size
    if cfg.cache.kv_cache_dtype != "auto":
        raise ValueError(f"kv_cache_dtype: {cfg.cache.kv_cache_dtype} is not implemented with pp_size > 1 "
                         "(use auto)")
    config = loader.load_config(loader.resolve_hf_dir(cfg.model.path))
    layers = int(config.num_hidden_layers)
    if pp > layers:
        raise ValueError(f"pp_size: {pp} stages cannot split {layers} layers (at most one stage a layer)")
    cls = model_class(config)
    if not issubclass(cls, DecoderLM) or cls.final_hidden is not DecoderLM.final_hidden:
        raise ValueError(f"pp_size: pipeline parallelism with {config.model_type} is not supported (use pp_size 1)")
