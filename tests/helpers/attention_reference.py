"""The per-request dense attention that the CPU attention backends are checked against."""
from __future__ import annotations

import torch


def attention_reference(q, pool, rows, prefix_lens, ext_lens, scaling, dtype=torch.float32) -> torch.Tensor:
    """Layer 0 of ``pool``: request ``i``'s new tokens (packed in ``q``) attend causally to the
    slots ``rows[i]``; computed one request at a time in ``dtype``."""
    outs, off = [], 0
    h = q.shape[1]
    for r, p, n in zip(rows, prefix_lens, ext_lens):
        k = pool.k_buffer[0][r[: p + n]].to(dtype)
        v = pool.v_buffer[0][r[: p + n]].to(dtype)
        rep = h // k.shape[1]
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        s = torch.einsum("qhd,khd->hqk", q[off: off + n].to(dtype), k) * scaling
        causal = torch.arange(p + n).unsqueeze(0) <= (p + torch.arange(n)).unsqueeze(1)
        outs.append(torch.einsum("hqk,khd->qhd", s.masked_fill(~causal, float("-inf")).softmax(-1), v))
        off += n
    return torch.cat(outs)
