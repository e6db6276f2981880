"""radixserve's in-process ``Engine`` as a peer of the benchmark protocol
(``peer_runners/common.py``): greedy, EOS ignored, token ids in, one ``generate`` call per batch."""
from __future__ import annotations

from typing import Any


def greedy(n: int) -> dict[str, Any]:
    """Sampling params of every benchmark request: n tokens, greedy, EOS ignored."""
    return {"max_new_tokens": n, "ignore_eos": True, "temperature": 0}


class RadixPeer:
    """Wraps a ``radixserve.Engine``; ``cached_per_request`` comes from ``meta_info``."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def generate_one(self, prompt: list[int], n: int) -> list[int]:
        return self.engine.generate(input_ids=prompt, sampling_params=greedy(n))["output_ids"]

    def run_batch(self, prompts: list[list[int]], output_lens: list[int]) -> dict[str, Any]:
        outs = self.engine.generate(input_ids=prompts, sampling_params=[greedy(n) for n in output_lens])
        return {"outputs": [o["output_ids"] for o in outs],
                "cached_per_request": [o["meta_info"]["cached_tokens"] for o in outs]}

    def reset_cache(self) -> None:
        if not self.engine.flush_cache():
            raise RuntimeError("flush_cache() refused (requests still running?)")
