"""The Hugging Face transformers baseline: fp32 ``generate`` in static batches (bench_offline.py,
bench_peers.py).

Greedy (``do_sample=False``) with ``min_new_tokens = max_new_tokens`` so every row makes all
its tokens (EOS ignored).  Prompts of a batch are LEFT-padded to the longest one; a batch
generates as many tokens as its longest request wants and each request keeps only its own
``output_len`` (the rest is static batching's waste, and counts against HF's time).  With
``max_batches`` only the first batches run and the time is extrapolated linearly to all of
them (``extrapolated`` in the result).
"""
from __future__ import annotations

import gc
import time
from typing import Any, Optional

import torch
from tqdm import tqdm


class HFPeer:
    """A transformers causal LM in fp32, driven by batched ``generate``."""

    def __init__(self, model_path: str, batch_size: int = 16, max_batches: Optional[int] = None) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
        cfg = self.model.config
        self.pad_id = cfg.eos_token_id if cfg.pad_token_id is None else cfg.pad_token_id
        if isinstance(self.pad_id, list):
            self.pad_id = self.pad_id[0]
        self.batch_size, self.max_batches = batch_size, max_batches

    def _generate(self, batch: list[list[int]], n: int) -> list[list[int]]:
        width = max(map(len, batch))
        ids = torch.tensor([[self.pad_id] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        with torch.inference_mode():
            out = self.model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=n,
                                      min_new_tokens=n, pad_token_id=self.pad_id)
        return out[:, width:].tolist()

    def generate_one(self, prompt: list[int], n: int) -> list[int]:
        return self._generate([prompt], n)[0]

    def run_batch(self, prompts: list[list[int]], output_lens: list[int]) -> dict[str, Any]:
        """Batches of ``batch_size`` in order; only the first ``max_batches`` if set (extrapolated)."""
        starts = list(range(0, len(prompts), self.batch_size))
        todo = starts[: self.max_batches] if self.max_batches else starts
        outputs: list[list[int]] = []
        secs = 0.0
        for s in tqdm(todo, desc="HF generate", unit="batch", leave=False):
            lens = output_lens[s: s + self.batch_size]
            t0 = time.perf_counter()
            rows = self._generate(prompts[s: s + self.batch_size], max(lens))
            secs += time.perf_counter() - t0
            outputs += [row[:n] for row, n in zip(rows, lens)]
        outputs += [[0] * n for n in output_lens[len(outputs):]]  # never run: placeholders of the right length
        extra = {"measured_time_s": secs, "batches_timed": len(todo), "batches_total": len(starts),
                 "extrapolated": len(todo) < len(starts), "requests_run": sum(min(self.batch_size, len(prompts) - s)
                                                                               for s in todo)}
        return {"outputs": outputs, "time_s": secs * len(starts) / len(todo), "extra": extra}

    def reset_cache(self) -> None:
        """HF keeps no cache between ``generate`` calls."""

    def close(self) -> None:
        del self.model
        gc.collect()
