"""CacheBlend's choice of the reused document tokens to recompute (issue 46; the scheduler side is
``scheduler/documents.py``, the placement ``worker/doc_kv.py``).

A reused document's KV was computed without the documents placed before it; which of its tokens
most need recomputing shows early: layer 0's K/V depend only on the token and its position (so they
deviate by rounding only), layer 1's already on the context.  For each window whose ``StepReq``
has ``doc_select`` "deviation", after the candidates' KV is placed (``reuse_dst``: every document
token with cached KV), the probe

1. runs layer 0 over the whole window at its positions (writing layer 0's K/V, the same a full
   prefill writes, up to rounding), each token attending to the row's keys up to its position;
2. projects the candidates' layer-1 K/V from that (layer 1's input norm, q/k norms, rotary);
3. scores each candidate ``||K_new - K_reused|| + ||V_new - V_reused||`` (fp32, over every KV head;
   a quantized pool is dequantized) and keeps the ``budget`` highest over the window, where
   ``budget`` is the number of candidates the scheduler marked computed.

``compute`` becomes the window's non-candidate computed indices (text outside documents, the last
prompt token, documents without cached KV: always kept) plus those; its length is unchanged, so
the scheduler's accounting holds.  ``refusal`` says where the probe cannot run; the scheduler's
choice (each document's first tokens) then stands, logged once per reason.
"""
from __future__ import annotations

import logging
from typing import Any, Optional, Sequence

import numpy as np
import torch

from radixserve.attention.base import AttentionBackend, ForwardBatch, ForwardMode
from radixserve.ipc.worker_link import StepReq
from radixserve.mem_cache.kv_pool import KVPool
from radixserve.model.layers.decoder import Attention, DecoderLayer

logger = logging.getLogger(__name__)
_LOGGED: set[str] = set()


def refusal(model: Any) -> Optional[str]:
    """Why the layer-1 probe cannot run on ``model`` (None: it can)."""
    layers = getattr(model, "layers", None)
    if getattr(getattr(model, "layout", None), "size", 1) > 1:
        return "tensor parallelism (each rank would score its own heads)"
    if getattr(model, "lora", None) is not None:
        return "LoRA adapters are served (the probe runs without their deltas)"
    stage = getattr(model, "stage", None)
    if stage is None or stage.count != 1:
        return "pipeline parallelism"
    if layers is None or len(layers) < 2:
        return "a model with fewer than two layers (nothing deviates before layer 1)"
    if not isinstance(layers[0], DecoderLayer) or type(layers[1].self_attn) is not Attention:
        return f"{type(model).__name__}'s layers (not a DecoderLayer with Llama attention)"
    return None


def split(r: StepReq) -> Optional[tuple[np.ndarray, np.ndarray, int]]:
    """(candidate window indices, always-computed indices, budget) of ``r``, or None when there is
    nothing to choose (no candidate, or all or none of them computed)."""
    if r.doc_select != "deviation" or r.compute is None or r.reuse_dst is None or not len(r.reuse_dst):
        return None
    cand = np.isin(r.slots, r.reuse_dst)
    comp = np.zeros(len(r.slots), dtype=bool)
    comp[r.compute] = True
    budget = int((comp & cand).sum())
    n_cand = int(cand.sum())
    if budget == 0 or budget == n_cand:
        return None
    return np.nonzero(cand)[0], np.nonzero(comp & ~cand)[0], budget


def _probe_batch(reqs: Sequence[StepReq], table: torch.Tensor, device: torch.device) -> ForwardBatch:
    """A plain extend of each request's whole window (prefix slots written into ``table``)."""
    for r in reqs:
        if r.prefix_slots is not None and r.start:
            table[r.row, : r.start] = torch.from_numpy(r.prefix_slots.astype(np.int32))
    lens = [len(r.slots) for r in reqs]
    starts = [r.start for r in reqs]
    seqs = [s + n for s, n in zip(starts, lens)]
    lens_t = torch.tensor(lens, dtype=torch.int64)
    cat = lambda xs: torch.from_numpy(np.concatenate(xs).astype(np.int64)).to(device)  # noqa: E731
    return ForwardBatch(
        mode=ForwardMode.EXTEND, input_ids=cat([r.input_ids for r in reqs]),
        positions=cat([np.arange(r.start, r.start + len(r.slots)) for r in reqs]),
        out_cache_loc=cat([r.slots for r in reqs]),
        req_pool_indices=torch.tensor([r.row for r in reqs], dtype=torch.int64, device=device),
        seq_lens=torch.tensor(seqs, dtype=torch.int64, device=device),
        extend_prefix_lens=torch.tensor(starts, dtype=torch.int64, device=device),
        extend_seq_lens=lens_t.to(device), extend_start_loc=(torch.cumsum(lens_t, 0) - lens_t).to(device),
        req_to_token=table, seq_lens_cpu=seqs, extend_prefix_lens_cpu=starts, extend_seq_lens_cpu=lens)


@torch.inference_mode()
def deviations(model: Any, backend: AttentionBackend, pool: KVPool, batch: ForwardBatch,
               rows: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """fp32 ``[len(rows)]``: layer 1's ``||dK|| + ||dV||`` of ``batch``'s tokens ``rows`` (KV slots
    ``slots``) against the KV in the pool there.  Writes layer 0's K/V of every token of ``batch``."""
    backend.init_forward_metadata(batch)
    x, residual = model.layers[0].forward(model.embed(batch.input_ids), None, batch, backend)
    x, residual = x.index_select(0, rows).contiguous(), residual.index_select(0, rows).contiguous()
    layer = model.layers[1]
    attn = layer.self_attn
    h, _ = layer.input_layernorm.add_forward(x, residual)
    qkv = attn.qkv_proj(h)
    if attn.q_norm is not None:
        qkv = qkv.contiguous()
        attn.rotary.ops.rms_norm_heads_(qkv, attn.q_norm.weight, attn.k_norm.weight, attn.num_heads,
                                        attn.num_kv_heads, attn.q_norm.eps)
    q, k, v = qkv.split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
    q = q.reshape(-1, attn.num_heads, attn.head_dim).contiguous()
    k = k.reshape(-1, attn.num_kv_heads, attn.head_dim).contiguous()
    attn.rotary.forward(batch.positions.index_select(0, rows), q, k)
    old_k, old_v = pool.read_kv(attn.layer_id, slots)
    dk = (k.float() - old_k.float()).flatten(1).norm(dim=1)
    dv = (v.float().reshape(len(rows), -1) - old_v.float().flatten(1)).norm(dim=1)
    return dk + dv


def choose(model: Any, backend: AttentionBackend, pool: KVPool, table: torch.Tensor, reqs: Sequence[StepReq],
           device: torch.device) -> None:
    """Replace the ``compute`` of each of ``reqs`` that asks for "deviation" (see the module doc);
    the others, and all of them where ``refusal`` says so, keep theirs."""
    todo = [(r, s) for r in reqs if (s := split(r)) is not None]
    if not todo:
        return
    why = refusal(model)
    if why is not None:
        if why not in _LOGGED:
            _LOGGED.add(why)
            logger.warning("document_select deviation: recomputing each document's first tokens instead: %s", why)
        return
    batch = _probe_batch([r for r, _ in todo], table, device)
    rows, slots, offset = [], [], 0
    for r, (cand, _, _) in todo:
        rows.append(offset + cand)
        slots.append(r.slots[cand])
        offset += len(r.slots)
    cat = lambda xs: torch.from_numpy(np.concatenate(xs).astype(np.int64)).to(device)  # noqa: E731
    dev = deviations(model, backend, pool, batch, cat(rows), cat(slots)).cpu()
    at = 0
    for r, (cand, keep, budget) in todo:
        mine = dev[at: at + len(cand)]
        at += len(cand)
        top = torch.topk(mine, budget, sorted=False).indices.numpy()
        r.compute = np.sort(np.concatenate([keep, cand[top]])).astype(np.int64)
