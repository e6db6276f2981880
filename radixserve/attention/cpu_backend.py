"""Attention on the CPU with the native kernel (``--attention-backend cpu``; ``auto`` on CPU).

The kernel (``kernels/cpu/paged_attention.cpp``) reads K/V straight from the pool through the
request->token table, in the pool's dtype (fp32 or bf16), accumulating in fp32 with an
online softmax; no per-layer gather, no dtype conversion of the context.  Over a bf16 pool
with AVX-512 it runs pair-interleaved bf16 tiles (``kernels/cpu/attn_bf16.h``), with AMX
tile products for blocks of 4+ query rows where the CPU and the OS allow (the probabilities
are rounded to bf16 there).  Requests that share
leading slots read the shared part once, and GQA query heads share every K/V tile.
``init_forward_metadata`` builds the plan (``cpu_plan.py``) once per step; each layer is
one call into the kernel.  A shared prefix with at least ``DENSE_MIN_ROWS`` query rows per
KV head (the members' tokens of an extend step) is computed instead with torch's flash
attention (``_scaled_dot_product_flash_attention_for_cpu``: bf16 GEMMs on AMX/AVX-512, with
the log-sum-exp the merge needs) over the prefix's K/V gathered once: on the development
machine 16 groups x 512 query tokens x 512 prefix keys took 16 ms per layer against 77 ms
in the kernel's fp32 tiles (bf16; fp32 42 ms).  A prompt's own causal block with nothing
cached goes there as well, except over a bf16 pool where the kernel runs AMX blocks: those
are faster than flash attention for such blocks.  That is the default ``DenseRule``; the
model runner passes the one ``worker/tuning/attention_timing.py`` measured on the machine at hand
(on an AMD Zen 4 the kernel won both kinds of block in bf16).

A quantized pool (``KVPool.quant``: packed int8/fp8 rows with a scale per token and head) is read
by the same kernel, which dequantizes each K/V row as it loads it (the key's scale multiplies its
scores, the value's its weights; fp32 tiles); the new tokens' rows are packed by one native op per
layer (``store_kv``: ``radixserve_cpu::store_kv_packed``), and flash-attention blocks read the
prefix dequantized (``KVPool.read_kv``).  Its callers do not write raw K/V into it
(``caller_stores_kv`` is None); the layer loop and stack pack their staged K/V themselves
(``packed_store``, the kernel's kv_format).

Sliding windows and logit soft-capping (``LayerAttention``) are the kernel's per-call ``window``
and ``softcap``.  A backend with such layers keeps one plan per (window, soft-capped) of the
step, built on first use: a window's plan cuts every task to the keys its tokens see (see
``cpu_plan.py``), a window no shorter than the step's longest sequence is no window, and a
soft-capped layer has no flash-attention blocks (flash attention has no cap).  Plain layers
keep the plain plan.  ``native_layer_plans`` (the layer stack) gives each distinct layer
attention's plan, window, cap and K/V tables (``_layer_tables``: the one place a layer's slots
are chosen) and each layer's index into them, or None when a plan has flash-attention blocks;
``step_attention`` binds each layer's group once per step.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import torch

from radixserve.attention.base import AttentionBackend, ForwardBatch, LayerAttention, NativeGroup
from radixserve.attention.cpu_plan import CpuAttnPlan, build_plan
from radixserve.kernels import cpu_native
from radixserve.mem_cache.kv_pool import KVPool

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16)
MIN_SHARED_PREFIX = 32
DENSE_MIN_ROWS = 512  # query rows per KV head from which a shared prefix goes to flash attention
AMX_BF16 = 2  # attention_bf16_mode's value when the kernel runs AMX tile blocks


@dataclass(frozen=True)
class DenseRule:
    """Which blocks go to torch's flash attention instead of the kernel: a shared prefix with at
    least ``shared_min_rows`` query rows per KV head, a prompt's own causal block with at least
    ``causal_min_rows`` (0 in either: never).  ``bf16_dot``: over a bf16 pool, the kernel's
    blocks that do not run on AMX use AVX512-BF16 dot products (``attention_bf16_dot``; a
    process-wide setting, applied when the backend is made).  ``worker/tuning/attention_timing.py``
    measures all three per machine."""

    shared_min_rows: int = DENSE_MIN_ROWS
    causal_min_rows: int = DENSE_MIN_ROWS
    bf16_dot: bool = False


@dataclass
class _StepPlans:
    """A step's plans when some layer is not plain: by (effective window, soft-capped, in the
    sliding pool), built on first use from the step's host-side sizes (``inputs``; a sliding
    pool's layers plan over their own table's rows, so only keys they share are shared)."""

    inputs: tuple
    max_seq: int
    plans: dict[tuple[Optional[int], bool, bool], CpuAttnPlan] = field(default_factory=dict)
    swa_inputs: Optional[tuple] = None


_PLAIN = LayerAttention()


def available(kv_pool: KVPool) -> bool:
    """True when the kernel builds/loads here and supports the pool (CPU, fp32 or bf16)."""
    return kv_pool.device.type == "cpu" and kv_pool.dtype in SUPPORTED_DTYPES and cpu_native.load()


class CpuBackend(AttentionBackend):
    supported_features = frozenset({"sliding_window", "logit_softcap", "sliding_pool"})

    def __init__(self, kv_pool: KVPool, dense: Optional[DenseRule] = None) -> None:
        super().__init__(kv_pool)
        if not available(kv_pool):
            raise RuntimeError("attention_backend: the cpu backend needs a CPU pool in float32 or bfloat16 and a "
                               "C++ compiler (see the log for the build error)")
        # A prompt's own causal block goes to flash attention too, unless the kernel runs AMX
        # blocks on this bf16 pool: then the kernel is faster (ShareGPT's 64 prompts, 4-912
        # tokens, on the AMX Xeon: 13.55 s against 14.05 s end to end).
        self.dense = dense or self.default_rule(kv_pool)
        if kv_pool.dtype == torch.bfloat16:
            torch.ops.radixserve_cpu.attention_bf16_dot(int(self.dense.bf16_dot))
        # attend reads K/V from the pool only; a packed pool is written by store_kv alone
        self.caller_stores_kv = None if kv_pool.quant else kv_pool.dtype
        self.kv_format = self.packed_store = cpu_native.KV_FORMATS[kv_pool.quant]

    @property
    def name(self) -> str:
        return "cpu"

    @staticmethod
    def default_rule(kv_pool: KVPool) -> DenseRule:
        """The rule measured on the AMX Xeon, used when none is given."""
        amx = kv_pool.dtype == torch.bfloat16 and int(torch.ops.radixserve_cpu.attention_bf16_mode(-1)) == AMX_BF16
        return DenseRule(DENSE_MIN_ROWS, 0 if amx else DENSE_MIN_ROWS)

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        seq_lens = np.asarray(batch.seq_lens_cpu, dtype=np.int64)
        ext_lens = np.asarray(batch.extend_seq_lens_cpu, dtype=np.int64)
        start_loc = batch.extend_start_loc.numpy()
        req_rows = batch.req_pool_indices.numpy()
        table = batch.req_to_token.numpy()
        width = int(seq_lens.max()) if len(seq_lens) else 0
        rows = table[req_rows, :width] if len(req_rows) > 1 else table[req_rows, :1]
        inputs = (rows, req_rows, seq_lens, ext_lens, start_loc)
        batch.attn_metadata = inputs if self.plain else _StepPlans(inputs, width)

    def _plan(self, batch: ForwardBatch, heads_per_kv: int, la: LayerAttention = _PLAIN) -> tuple[CpuAttnPlan, int]:
        """(the step's plan for a layer like ``la``, the kernel's ``window`` argument: 0 for none),
        built on the first layer that needs it (the query head count comes with q)."""
        meta = batch.attn_metadata
        if isinstance(meta, CpuAttnPlan):
            return meta, 0
        if isinstance(meta, tuple):  # every layer plain: the one plan replaces the step's sizes
            batch.attn_metadata = self._build_plan(batch, meta, heads_per_kv, None, False)
            return batch.attn_metadata, 0
        window = la.sliding_window if la.sliding_window is not None and la.sliding_window < meta.max_seq else None
        sliding = self._sliding(la)
        key = (window, la.logit_softcap is not None, sliding)
        if key not in meta.plans:
            inputs = meta.inputs
            if sliding:
                if meta.swa_inputs is None:
                    table = batch.swa_req_to_token.numpy()
                    req_rows = inputs[1]
                    rows = table[req_rows, :meta.max_seq] if len(req_rows) > 1 else table[req_rows, :1]
                    meta.swa_inputs = (rows,) + inputs[1:]
                inputs = meta.swa_inputs
            meta.plans[key] = self._build_plan(batch, inputs, heads_per_kv, *key)
        return meta.plans[key], window or 0

    def _build_plan(self, batch: ForwardBatch, inputs: tuple, heads_per_kv: int, window: Optional[int],
                    capped: bool, sliding: bool = False) -> CpuAttnPlan:
        rows, req_rows, seq_lens, ext_lens, start_loc = inputs
        dense = self.dense if not capped else DenseRule(0, 0)  # flash attention has no soft-cap
        plan = build_plan(rows, req_rows, seq_lens, ext_lens, start_loc, heads_per_kv, self.kv_pool.num_kv_heads,
                          torch.get_num_threads(), MIN_SHARED_PREFIX, dense_min_rows=dense.shared_min_rows,
                          dense_causal_min_rows=dense.causal_min_rows, window=window, gapped=batch.gapped_cpu)
        table = batch.slots(sliding)[1]
        plan.dense_slots = [table[row, ks:ke].long() for row, ks, ke, *_ in plan.dense]
        return plan

    def store_kv(self, layer_id: int, batch: ForwardBatch, k: torch.Tensor, v: torch.Tensor) -> None:
        if not self.kv_format:
            return super().store_kv(layer_id, batch, k, v)
        pool = self.kv_pool
        if k.dtype not in SUPPORTED_DTYPES:
            k, v = k.to(pool.dtype), v.to(pool.dtype)
        torch.ops.radixserve_cpu.store_kv_packed(k, v, batch.layer_slots(pool, layer_id)[0], pool.k_buffer[layer_id],
                                                 pool.v_buffer[layer_id], self.kv_format)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, scaling: float,
               batch: ForwardBatch) -> torch.Tensor:
        pool = self.kv_pool
        la = self.layer_attention[layer_id]
        plan, window = self._plan(batch, q.shape[1] // pool.num_kv_heads, la)
        qc = (q if q.dtype == pool.dtype else q.to(pool.dtype)).contiguous()
        out = torch.empty_like(qc)
        parts = self._dense_parts(qc, layer_id, scaling, batch, plan) if plan.dense else None
        cpu_native.paged_attention(qc, pool.k_buffer[layer_id], pool.v_buffer[layer_id], self._layer_tables(batch, la)[1],
                                   plan, batch.positions, scaling, out, parts, window, la.logit_softcap or 0.0,
                                   self.kv_format)
        return out if out.dtype == q.dtype else out.to(q.dtype)

    def _sliding(self, la: LayerAttention) -> bool:
        """Whether layers like ``la`` keep their K/V in the sliding-window pool (``KVPool.is_sliding``)."""
        return self.kv_pool.hybrid and la.sliding_window is not None

    def _layer_tables(self, batch: ForwardBatch, la: LayerAttention) -> tuple[torch.Tensor, torch.Tensor]:
        """``(loc, req_to_token)`` of the layers like ``la``: where their new K/V are stored and the
        table the kernel reads their keys through."""
        return batch.slots(self._sliding(la))

    def _kinds(self) -> tuple[list[LayerAttention], list[int]]:
        """The distinct layer attentions and each layer's index into them (once per
        ``set_layer_attention``: the same index list until the layers change)."""
        known = self.__dict__.get("_kinds_of")
        if known is None or known[0] is not self.layer_attention:
            kinds = list(dict.fromkeys(self.layer_attention))
            index = [kinds.index(la) for la in self.layer_attention]
            known = self.__dict__["_kinds_of"] = (self.layer_attention, kinds, index)
        return known[1], known[2]

    def _groups(self, batch: ForwardBatch, num_heads: int) -> tuple[list[Optional[NativeGroup]], list[int]]:
        """Each distinct layer attention's ``NativeGroup`` this step (None where its plan has
        flash-attention blocks) and each layer's index into them."""
        kinds, index = self._kinds()
        heads_per_kv = num_heads // self.kv_pool.num_kv_heads
        groups: list[Optional[NativeGroup]] = []
        for la in kinds:
            plan, window = self._plan(batch, heads_per_kv, la)
            if plan.dense:
                groups.append(None)
                continue
            groups.append(NativeGroup(*self._layer_tables(batch, la), plan.tasks, plan.entry_tok, plan.tok_ptr,
                                      plan.tok_entries, int(window), float(la.logit_softcap or 0.0)))
        return groups, index

    def native_layer_plans(self, batch: ForwardBatch, num_heads: int) -> Optional[tuple[list[NativeGroup], list[int]]]:
        groups, index = self._groups(batch, num_heads)
        return None if any(g is None for g in groups) else (groups, index)

    def native_plan(self, batch: ForwardBatch, num_heads: int) -> Optional[tuple[torch.Tensor, ...]]:
        plans = self.native_layer_plans(batch, num_heads) if self.plain else None
        return None if plans is None else plans[0][0][1:6]

    def step_attention(self, batch: ForwardBatch, num_heads: int) -> Callable[[torch.Tensor, int, float], torch.Tensor]:
        """``attend`` with each layer's group (plan tensors, window, cap), the pool's layers and one
        output buffer bound once per step: a single call into the kernel per layer; a layer whose
        plan has flash-attention blocks takes the general path (see the base class for the contract)."""
        pool = self.kv_pool
        groups, index = self._groups(batch, num_heads)
        general = super().step_attention(batch, num_heads)
        kernel = torch.ops.radixserve_cpu.paged_attention.default
        k_bufs, v_bufs, positions, kv_format = pool.k_buffer, pool.v_buffer, batch.positions, self.kv_format
        out = torch.empty(batch.num_tokens, num_heads, pool.head_dim, dtype=pool.dtype)
        bound = [groups[g] for g in index]

        def attend(q: torch.Tensor, layer_id: int, scaling: float) -> torch.Tensor:
            group = bound[layer_id]
            if group is None:
                return general(q, layer_id, scaling)
            _, r2t, tasks, entry_tok, tok_ptr, tok_entries, window, cap = group
            kernel(q, k_bufs[layer_id], v_bufs[layer_id], r2t, tasks, entry_tok, positions, tok_ptr, tok_entries,
                   scaling, out, None, None, window, cap, kv_format)
            return out

        return attend

    def _dense_parts(self, q: torch.Tensor, layer_id: int, scaling: float, batch: ForwardBatch,
                     plan) -> tuple[torch.Tensor, torch.Tensor]:
        """Partial buffers for the kernel with the plan's dense blocks filled (normalized output
        and log-sum-exp per entry and head) by torch's flash attention over the block's K/V."""
        pool = self.kv_pool
        num_entries, (heads, dim), hkv = plan.entry_tok.shape[0], q.shape[1:], pool.num_kv_heads
        g = heads // hkv
        part_o = torch.empty(num_entries, heads, dim, dtype=torch.float32)
        part_lse = torch.empty(num_entries, heads, dtype=torch.float32)
        flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        for (_, _, _, e0, toks, causal), slots in zip(plan.dense, plan.dense_slots):
            k, v = (x.transpose(0, 1) for x in pool.read_kv(layer_id, slots))  # [Hkv, S, D]
            n = len(toks)
            qt = q.index_select(0, toks)
            if causal:  # token i sees keys 0..i: one query row per (head, token), K/V repeated per head
                k, v = (x.repeat_interleave(g, dim=0).unsqueeze(0) for x in (k, v))
                o, lse = flash(qt.transpose(0, 1).unsqueeze(0), k, v, 0.0, True, scale=scaling)[:2]
                part_o[e0: e0 + n] = o[0].transpose(0, 1)
                part_lse[e0: e0 + n] = lse[0].transpose(0, 1)
                continue
            # no mask: the G query heads of a KV head become rows against its K/V (read once)
            qq = qt.view(n, hkv, g, dim).transpose(0, 1).reshape(1, hkv, n * g, dim)
            o, lse = flash(qq, k.unsqueeze(0), v.unsqueeze(0), 0.0, False, scale=scaling)[:2]
            part_o[e0: e0 + n] = o.view(hkv, n, g, dim).transpose(0, 1).reshape(n, heads, dim)
            part_lse[e0: e0 + n] = lse.view(hkv, n, g).transpose(0, 1).reshape(n, heads)
        return part_o, part_lse
