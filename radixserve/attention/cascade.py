"""Shared-prefix ("cascade") attention for the torch-native backend.

Requests whose request->token rows start with the same KV slots share a radix-cached
prefix.  Gathering that prefix once per group instead of once per request, and scoring the
whole group's queries against it in one matmul, cuts the bytes moved per layer by the
group size; on a 2-core CPU the per-request gather of K/V is what bounds decode.

Attention splits into a prefix part (every query of the group sees all ``P_g`` prefix
keys) and a per-request suffix part (positions ``P_g .. seq_len``, causal); the two are
merged with their log-sum-exps.  Group detection is vectorized: a request joins the group
of the first request with the same first slot, and ``P_g`` is the shortest common prefix
of the group's rows.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

_NEG = float("-inf")


@dataclass
class CascadeMeta:
    num_groups: int
    max_members: int
    prefix_index: torch.Tensor  # int64 [G * Pmax]: prefix slots per group (0 = pad)
    prefix_bias: torch.Tensor  # f32 [G, 1, 1, Pmax]: 0 for real keys, -inf for pad
    member_index: torch.Tensor  # int64 [G * Nmax]: request of each member slot (pad -> 0, unused)
    member_of: torch.Tensor  # int64 [B]: flat member position of each request (-1 if none)
    prefix_len: int
    suffix_index: torch.Tensor  # int64 [B * Smax]
    suffix_bias: torch.Tensor  # f32 [B, 1, Qmax (x heads per kv head after the first layer), Smax]
    suffix_len: int


def build(rows: torch.Tensor, seq_lens: torch.Tensor, q_pos: torch.Tensor, min_prefix: int = 32):
    """rows ``[B, L]`` slots; ``q_pos [B, Qmax]`` absolute positions of each padded query
    (-1 for padding).  Returns None when no group would share at least ``min_prefix``
    tokens between two or more requests."""
    bsz, max_len = rows.shape
    dev = rows.device
    ar = torch.arange(max_len, device=dev)
    valid = ar.unsqueeze(0) < seq_lens.unsqueeze(1)
    first = rows[:, 0]
    _, inv = torch.unique(first, return_inverse=True)
    num = int(inv.max()) + 1
    idx = torch.arange(bsz, device=dev)
    leader = torch.full((num,), bsz, device=dev, dtype=torch.int64).scatter_reduce(0, inv, idx, "amin")
    same = (rows == rows[leader[inv]]) & valid & valid[leader[inv]]
    lcp = same.to(torch.int32).cumprod(1).sum(1).to(torch.int64)
    # queries of a request sit at positions >= its cached prefix, which bounds lcp already
    plen = torch.full((num,), max_len, device=dev, dtype=torch.int64).scatter_reduce(0, inv, lcp, "amin")
    size = torch.bincount(inv, minlength=num)
    use = (size >= 2) & (plen >= min_prefix)
    if not bool(use.any()):
        return None
    groups = torch.nonzero(use).squeeze(1)
    g_of = torch.full((num,), -1, device=dev, dtype=torch.int64)
    g_of[groups] = torch.arange(len(groups), device=dev)
    req_g = g_of[inv]  # group of each request, -1 if it has none
    p_req = torch.where(req_g >= 0, plen[inv], torch.zeros_like(lcp))
    num_g = len(groups)
    p_g = plen[groups]
    pmax = int(p_g.max())
    pa = torch.arange(pmax, device=dev)
    pvalid = pa.unsqueeze(0) < p_g.unsqueeze(1)
    prefix_index = torch.where(pvalid, rows[leader[groups]][:, :pmax], torch.zeros((), dtype=rows.dtype, device=dev))
    prefix_bias = torch.zeros(num_g, pmax, device=dev).masked_fill(~pvalid, _NEG).view(num_g, 1, 1, pmax)
    # member slots: order requests by group, then pack [G, Nmax]
    in_g = req_g >= 0
    members = torch.nonzero(in_g).squeeze(1)
    order = members[torch.argsort(req_g[members], stable=True)]
    counts = torch.bincount(req_g[order], minlength=num_g)
    nmax = int(counts.max())
    start = torch.cumsum(counts, 0) - counts
    rank = torch.arange(len(order), device=dev) - start[req_g[order]]
    flat = req_g[order] * nmax + rank
    member_index = torch.zeros(num_g * nmax, device=dev, dtype=torch.int64)
    member_index[flat] = order
    member_of = torch.full((bsz,), -1, device=dev, dtype=torch.int64)
    member_of[order] = flat
    # per-request suffix [P_req, seq_len), causal against the query positions
    s_len = seq_lens - p_req
    smax = int(s_len.max())
    sa = torch.arange(smax, device=dev)
    key_pos = p_req.unsqueeze(1) + sa.unsqueeze(0)
    svalid = sa.unsqueeze(0) < s_len.unsqueeze(1)
    suffix_index = torch.where(svalid, rows.gather(1, key_pos.clamp(max=max_len - 1)),
                               torch.zeros((), dtype=rows.dtype, device=dev))
    allowed = svalid.unsqueeze(1) & (key_pos.unsqueeze(1) <= q_pos.unsqueeze(2))
    allowed[:, :, 0] |= q_pos < 0  # padded queries see one key so softmax stays finite
    suffix_bias = torch.zeros(allowed.shape, device=dev).masked_fill(~allowed, _NEG).unsqueeze(1)
    return CascadeMeta(num_g, nmax, prefix_index.reshape(-1), prefix_bias, member_index, member_of,
                       pmax, suffix_index.reshape(-1), suffix_bias, smax)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, scaling: float):
    """q ``[N, Hkv, M, D]``, k/v ``[N, Hkv, S, D]``; returns (out ``[N, Hkv, M, D]``, lse ``[N, Hkv, M]``)."""
    s = torch.matmul(q, k.transpose(-1, -2)).mul_(scaling).add_(bias)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s.sub_(lse.unsqueeze(-1)))
    return torch.matmul(p, v), lse


def forward(m: CascadeMeta, q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, scaling: float) -> torch.Tensor:
    """q ``[B, Qmax, H, D]`` (fp32, padded); returns ``[B, Qmax, H, D]``."""
    bsz, qmax, h, d = q.shape
    hkv = k_buf.shape[1]
    gh = h // hkv
    cd = q.dtype
    # suffix: per request
    ks = k_buf.index_select(0, m.suffix_index).to(cd).view(bsz, m.suffix_len, hkv, d).transpose(1, 2)
    vs = v_buf.index_select(0, m.suffix_index).to(cd).view(bsz, m.suffix_len, hkv, d).transpose(1, 2)
    qh = q.view(bsz, qmax, hkv, gh, d).permute(0, 2, 1, 3, 4).reshape(bsz, hkv, qmax * gh, d)
    if m.suffix_bias.shape[2] != qmax * gh:  # expand the query axis to every head once per step
        m.suffix_bias = m.suffix_bias.repeat_interleave(gh, dim=2)
    out_s, lse_s = _attend(qh, ks, vs, m.suffix_bias, scaling)
    # prefix: per group, all members' queries at once
    g, nmax, plen = m.num_groups, m.max_members, m.prefix_len
    kp = k_buf.index_select(0, m.prefix_index).to(cd).view(g, plen, hkv, d).transpose(1, 2)
    vp = v_buf.index_select(0, m.prefix_index).to(cd).view(g, plen, hkv, d).transpose(1, 2)
    qg = qh.index_select(0, m.member_index).view(g, nmax, hkv, qmax * gh, d).transpose(1, 2)
    out_p, lse_p = _attend(qg.reshape(g, hkv, nmax * qmax * gh, d), kp, vp, m.prefix_bias, scaling)
    out_p = out_p.view(g, hkv, nmax, qmax * gh, d).transpose(1, 2).reshape(g * nmax, hkv, qmax * gh, d)
    lse_p = lse_p.view(g, hkv, nmax, qmax * gh).transpose(1, 2).reshape(g * nmax, hkv, qmax * gh)
    has = m.member_of >= 0
    sel = m.member_of.clamp(min=0)
    lse_pr = torch.where(has.view(bsz, 1, 1), lse_p.index_select(0, sel), torch.full_like(lse_s, _NEG))
    out_pr = out_p.index_select(0, sel)
    mx = torch.maximum(lse_s, lse_pr)
    ws = torch.exp(lse_s - mx).unsqueeze(-1)
    wp = torch.exp(lse_pr - mx).unsqueeze(-1)
    out = (out_s * ws + out_pr * wp) / (ws + wp)
    return out.view(bsz, hkv, qmax, gh, d).permute(0, 2, 1, 3, 4).reshape(bsz, qmax, h, d)
