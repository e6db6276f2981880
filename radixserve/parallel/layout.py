"""Which part of each weight a tensor-parallel rank holds, and the slicing that loads it.

Every rank loads the full checkpoint tensors and keeps its slice (fine for the model sizes
this runtime serves; the full tensor is transient, one at a time).

* Attention: whole KV heads are split over the ranks in contiguous runs (as evenly as
  possible, so 3 KV heads on 2 ranks give 2 + 1), each rank taking the query heads of its
  KV heads.  With fewer KV heads than ranks, each KV head is replicated on
  ``tp / kv_heads``-ish consecutive ranks, which split its query heads.  Either way a
  rank's query heads use its KV heads in order with one group size, so the attention
  backends see an ordinary (smaller) GQA layer.  qkv is column-parallel; o_proj is
  row-parallel (its input columns are the rank's query heads), followed by an all-reduce.
* MLP: gate/up columns split as evenly as possible (column-parallel), down_proj row-parallel.
* Vocabulary: the embedding and the LM head hold ``ceil(vocab / tp)`` rows each (the last
  shard zero-padded); the embedding zeroes rows of ids outside the shard and all-reduces,
  and the head's logits are gathered on rank 0.
* Biases of row-parallel layers are kept on rank 0 only (the all-reduce adds them once).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


def _even_split(n: int, parts: int, i: int) -> tuple[int, int]:
    """(start, count) of part ``i`` when ``n`` items are split into ``parts`` contiguous runs."""
    base, extra = divmod(n, parts)
    return i * base + min(i, extra), base + (1 if i < extra else 0)


@dataclass(frozen=True)
class TPLayout:
    """Rank ``rank`` of ``size``: its query heads ``[q_start, q_start + num_heads)``, KV heads
    ``[kv_start, kv_start + num_kv_heads)``, MLP columns and vocabulary rows."""

    rank: int
    size: int
    head_dim: int
    q_start: int
    num_heads: int
    kv_start: int
    num_kv_heads: int
    mlp_start: int
    intermediate: int
    vocab_start: int
    vocab_shard: int
    vocab_size: int

    @classmethod
    def of(cls, config: Any, rank: int = 0, size: int = 1) -> "TPLayout":
        """The layout of ``rank``; raises ValueError naming ``tp_size`` when the model cannot be split."""
        heads, kv = config.num_attention_heads, config.num_key_value_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        group = heads // kv
        if kv >= size:
            kv_start, nkv = _even_split(kv, size, rank)
            q_start, nq = kv_start * group, nkv * group
        else:  # replicate: ranks [first, first + sharing) share KV head kv_start
            kv_start, nkv = rank * kv // size, 1
            first = next(r for r in range(size) if r * kv // size == kv_start)
            sharing = sum(1 for r in range(size) if r * kv // size == kv_start)
            off, nq = _even_split(group, sharing, rank - first)
            q_start = kv_start * group + off
        short = kv < size and group < -(-size // kv)  # some rank would get no query head
        if short or config.intermediate_size < size:
            raise ValueError(f"tp_size: {size} ranks cannot split {heads} attention heads "
                             f"({kv} KV heads) and {config.intermediate_size} MLP columns")
        mlp_start, inter = _even_split(config.intermediate_size, size, rank)
        vocab = config.vocab_size
        shard = -(-vocab // size)
        return cls(rank, size, head_dim, q_start, nq, kv_start, nkv, mlp_start, inter, rank * shard, shard, vocab)

    # ------------------------------------------------------------------ slicing
    def shard(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """This rank's part of the Hugging Face-named checkpoint tensor ``t`` (``t`` itself
        when the layout is the whole model)."""
        if self.size == 1:
            return t
        d = self.head_dim
        if ".q_proj." in name:
            return t[self.q_start * d:(self.q_start + self.num_heads) * d]
        if ".k_proj." in name or ".v_proj." in name:
            return t[self.kv_start * d:(self.kv_start + self.num_kv_heads) * d]
        if ".o_proj.weight" in name:
            return t[:, self.q_start * d:(self.q_start + self.num_heads) * d]
        if ".gate_proj." in name or ".up_proj." in name:
            return t[self.mlp_start:self.mlp_start + self.intermediate]
        if ".down_proj.weight" in name:
            return t[:, self.mlp_start:self.mlp_start + self.intermediate]
        if name.endswith("o_proj.bias") or name.endswith("down_proj.bias"):
            return t if self.rank == 0 else torch.zeros_like(t)
        if name.endswith("embed_tokens.weight") or name.endswith("lm_head.weight"):
            rows = t[self.vocab_start:self.vocab_start + self.vocab_shard]
            pad = self.vocab_shard - rows.shape[0]
            return torch.cat([rows, rows.new_zeros(pad, t.shape[1])]) if pad else rows
        return t
