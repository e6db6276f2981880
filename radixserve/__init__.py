"""radixserve: a prefix-sharing LLM serving runtime (radix-tree KV cache, continuous batching)."""
from radixserve.sampling_params import SamplingParams

__all__ = ["Engine", "SamplingParams"]
__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "Engine":
        from radixserve.engine import Engine

        return Engine
    raise AttributeError(name)
