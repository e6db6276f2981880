"""llama.cpp with every request of a batch decoded together (``mode=batched`` of llama_runner.py),
through llama-cpp-python's low-level API: what ``llama-server -np N --kv-unified`` and
llama.cpp's ``examples/parallel`` do.

One sequence id per request in a unified KV cache.  A prompt's tokens shared with the prompt
before it (the longest common prefix: the system prompt of a group-major shared-prefix
workload) are decoded ONCE, as single tokens that belong to every sequence sharing them
(``n_seq_id > 1``): that is llama.cpp's prefix sharing inside a batch, and
``cached_per_request`` counts those shared tokens.  Prompt tokens are packed into decode
calls of ``n_batch`` tokens; then every unfinished sequence adds one token per decode call.
Greedy = argmax of the logits, computed here with numpy.
"""
from __future__ import annotations

from typing import Any

import numpy as np


class _Tok:
    __slots__ = ("token", "pos", "seqs", "out_for")

    def __init__(self, token: int, pos: int, seq: int) -> None:
        self.token, self.pos, self.seqs, self.out_for = token, pos, [seq], -1


def plan_prefill(prompts: list[list[int]]) -> tuple[list[_Tok], list[int]]:
    """Prompt tokens to decode, shared with the previous prompt where they match (at least the
    last token of each prompt is its own: its logits give the first output), and how many
    tokens of each prompt were shared."""
    toks: list[_Tok] = []
    shared: list[int] = []
    prev: list[int] = []
    prev_toks: list[_Tok] = []
    for i, p in enumerate(prompts):
        n = 0
        while n < min(len(p) - 1, len(prev)) and p[n] == prev[n]:
            n += 1
        cur = prev_toks[:n]
        for t in cur:
            t.seqs.append(i)
        for pos in range(n, len(p)):
            cur.append(_Tok(p[pos], pos, i))
            toks.append(cur[-1])
        cur[-1].out_for = i
        shared.append(n)
        prev, prev_toks = p, cur
    return toks, shared


class LlamaBatchedPeer:
    """All requests of a batch at once, on one llama.cpp context with ``n_seq_max`` sequences."""

    def __init__(self, llama_cpp: Any, model_path: str, n_ctx: int, n_seq: int, cfg: dict[str, Any]) -> None:
        self.lc = llama_cpp
        try:  # the low-level loader logs every tensor; Llama(verbose=False) silences it the same way
            from llama_cpp._logger import set_verbose
            set_verbose(False)
        except ImportError:
            pass
        mparams = llama_cpp.llama_model_default_params()
        self.model = llama_cpp.llama_model_load_from_file(model_path.encode(), mparams)
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx, cparams.n_seq_max, cparams.kv_unified = n_ctx, n_seq, True
        cparams.n_batch, cparams.n_ubatch = cfg["n_batch"], cfg["n_ubatch"]
        cparams.n_threads = cparams.n_threads_batch = cfg["n_threads"]
        cparams.flash_attn_type = (llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if cfg["flash_attn"]
                                   else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        self.ctx = llama_cpp.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            raise RuntimeError("llama_init_from_model failed")
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self.model))
        self.n_batch, self.n_seq = cfg["n_batch"], n_seq
        self.batch = llama_cpp.llama_batch_init(self.n_batch, 0, n_seq)

    def _decode(self, items: list[tuple[int, int, list[int], bool]]) -> np.ndarray:
        """Decode (token, pos, seq ids, wants logits) items; argmax of each wanted row, in order."""
        b = self.batch
        for j, (tok, pos, seqs, out) in enumerate(items):
            b.token[j], b.pos[j], b.n_seq_id[j], b.logits[j] = tok, pos, len(seqs), out
            for k, s in enumerate(seqs):
                b.seq_id[j][k] = s
        b.n_tokens = len(items)
        rc = self.lc.llama_decode(self.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc} (KV cache full? n_ctx too small)")
        n_out = sum(1 for it in items if it[3])
        if not n_out:
            return np.empty(0, dtype=np.int64)
        logits = np.ctypeslib.as_array(self.lc.llama_get_logits(self.ctx), shape=(n_out * self.n_vocab,))
        return logits.reshape(n_out, self.n_vocab).argmax(axis=1)

    def run_batch(self, prompts: list[list[int]], output_lens: list[int]) -> dict[str, Any]:
        if len(prompts) > self.n_seq:
            raise ValueError(f"{len(prompts)} requests > n_seq_max {self.n_seq}")
        self.reset_cache()
        toks, shared = plan_prefill(prompts)
        outputs: list[list[int]] = [[] for _ in prompts]
        for s in range(0, len(toks), self.n_batch):
            chunk = toks[s: s + self.n_batch]
            firsts = self._decode([(t.token, t.pos, t.seqs, t.out_for >= 0) for t in chunk])
            for t, tok in zip([t for t in chunk if t.out_for >= 0], firsts):
                outputs[t.out_for].append(int(tok))
        while True:
            live = [i for i, o in enumerate(outputs) if len(o) < output_lens[i]]
            if not live:
                break
            for s in range(0, len(live), self.n_batch):
                part = live[s: s + self.n_batch]
                nxt = self._decode([(outputs[i][-1], len(prompts[i]) + len(outputs[i]) - 1, [i], True) for i in part])
                for i, tok in zip(part, nxt):
                    outputs[i].append(int(tok))
        return {"outputs": outputs, "cached_per_request": shared}

    def generate_one(self, prompt: list[int], n: int) -> list[int]:
        return self.run_batch([prompt], [n])["outputs"][0]

    def reset_cache(self) -> None:
        self.lc.llama_memory_clear(self.lc.llama_get_memory(self.ctx), True)
