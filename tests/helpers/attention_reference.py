"""The one paged-attention reference of the tests: every attention backend and kernel (CPU,
Triton, FlashInfer, torch_native) is checked against it."""
from __future__ import annotations

from typing import Optional

import torch

from radixserve.attention.base import ForwardBatch


def attention_reference(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, batch: ForwardBatch,
                        scaling: float, dtype: torch.dtype = torch.float32, sliding_window: Optional[int] = None,
                        logit_softcap: Optional[float] = None) -> torch.Tensor:
    """Request ``i``'s new tokens (``q`` rows from ``batch.extend_start_loc[i]``) attend causally
    to its ``seq_lens_cpu[i]`` slots (row ``req_pool_indices[i]`` of ``batch.req_to_token``) in
    one layer's ``k_buf`` / ``v_buf``, whose new tokens' K/V must already be stored; computed one
    request at a time in ``dtype`` on q's device, GQA by repeating the KV heads.  As in Hugging
    Face transformers: ``sliding_window`` W keeps a token at position p to keys at positions
    p - W + 1 .. p; ``logit_softcap`` c maps the scaled scores s to c * tanh(s / c) before the mask."""
    out = torch.empty(q.shape, dtype=dtype, device=q.device)
    group = q.shape[1] // k_buf.shape[1]
    for i in range(batch.batch_size):
        row = batch.req_to_token[batch.req_pool_indices[i], : batch.seq_lens_cpu[i]].long()
        keys = k_buf[row].to(dtype).repeat_interleave(group, 1)
        vals = v_buf[row].to(dtype).repeat_interleave(group, 1)
        s0, n = int(batch.extend_start_loc[i]), batch.extend_seq_lens_cpu[i]
        scores = torch.einsum("qhd,khd->hqk", q[s0: s0 + n].to(dtype), keys) * scaling
        if logit_softcap is not None:
            scores = torch.tanh(scores / logit_softcap) * logit_softcap
        pos = batch.extend_prefix_lens_cpu[i] + torch.arange(n, device=q.device)
        key_pos = torch.arange(len(row), device=q.device)[None, None, :]
        hidden = key_pos > pos[None, :, None]
        if sliding_window is not None:
            hidden |= key_pos <= pos[None, :, None] - sliding_window
        out[s0: s0 + n] = torch.einsum("hqk,khd->qhd", scores.masked_fill(hidden, float("-inf")).softmax(-1), vals)
    return out
