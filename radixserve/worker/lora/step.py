"""``LoRAStep``: the adapters' deltas of one step, added to the base linear layers' outputs.

Two paths, the same sums: the native segmented kernel (``kernels/cpu/lora_sgmv.cpp``, S-LoRA's
SGMV; CPU only): the rows grouped by slot, each slot's A and B read once per block of rows, only
each part's own columns of B; and stacked GEMMs (any device), where oneDNN's GEMMs win at many
rows.  The manager picks one per step by the row count, from a timing of both on this machine
(``timing.py``); the native layer stack runs a step on the kernel path (``model/cpu/layer_stack.py``).
The stacked GEMMs: for a fused module of ``parts`` parts, over the first ``k`` slots (those this
step uses, the slots' prefix up to the highest one): ``y += ((x @ A[:k].T) * mask) @ B[:k]``.
The mask is 1 on the ``parts x R`` columns of the row's slot and 0 elsewhere (a row of the base
model: all 0, so its output is left exactly as the base layer wrote it).  Three ops per module
and layer whatever the mix of adapters in the batch: one small GEMM into the slots' ranks, a
mask, one GEMM out, added in place (Punica's BGMV as two dense products over the stacked slots;
the waste is the other slots' ``R`` columns, a few percent of the base layer's work).

The holder (``LoRAHolder``) is what the model's layers see: ``step`` is None when no row of the
step uses an adapter, and the base path then runs as without LoRA (the native layer stack too).
"""
from __future__ import annotations

from typing import Optional

import torch

from radixserve.worker.lora.slots import LoRASlots


class LoRAStep:
    def __init__(self, slots: LoRASlots, row_slot: torch.Tensor, sgmv: bool) -> None:
        """``row_slot``: int64 [tokens], each token's slot (-1: the base model).  ``sgmv``: use the
        native segmented kernel (``kernels/cpu/lora_sgmv.cpp``) rather than the stacked GEMMs (the
        manager chooses, ``timing.py``).  On the kernel path ``rows``, ``bounds`` and ``seg_slots``
        are the kernel's (and the layer stack's) row groups."""
        self.slots = slots
        self.sgmv = sgmv
        if sgmv:
            if not _native():
                raise RuntimeError("lora: the native CPU kernels are not built (kernels/cpu_native.py)")
            self._segments(row_slot)
            return
        used = int(row_slot.max())
        self.k = used + 1  # slots [0, k) are read
        self.masks: dict[int, torch.Tensor] = {}
        r = slots.rank
        for parts in {slots.parts(m) for m in slots.modules}:
            width = parts * r
            cols = torch.arange(self.k * width, device=row_slot.device) // width  # each column's slot
            self.masks[parts] = (cols.unsqueeze(0) == row_slot.unsqueeze(1)).to(slots.dtype)

    def _segments(self, row_slot: torch.Tensor) -> None:
        """The rows with an adapter grouped by slot: their indices, the groups' bounds and slots."""
        order = torch.argsort(row_slot, stable=True)
        ordered = row_slot[order]
        keep = ordered >= 0
        self.rows = order[keep].contiguous()
        seg_slots, counts = torch.unique_consecutive(ordered[keep], return_counts=True)
        self.seg_slots = seg_slots.contiguous()
        self.bounds = torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)])

    def add(self, layer: int, module: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``y`` (the base layer's output for ``x``) plus each row's adapter delta, in place;
        returns ``y``.  A module the slots do not hold is left as it is."""
        a = self.slots.a.get((layer, module))
        if a is None:
            return y
        if self.sgmv:
            torch.ops.radixserve_cpu.lora_sgmv_(y.view(-1, y.shape[-1]), x.reshape(-1, x.shape[-1]).contiguous(), a,
                                                self.slots.b[layer, module], self.rows, self.bounds, self.seg_slots,
                                                self.slots.parts(module), self.slots.rank, self.slots.cols(module))
            return y
        mask = self.masks[self.slots.parts(module)]
        n = mask.shape[1]
        t = torch.mm(x.reshape(-1, x.shape[-1]), a[:n].t())
        t.mul_(mask)
        y2 = y.view(-1, y.shape[-1])
        y2.addmm_(t, self.slots.b[layer, module][:n])
        return y


def _native() -> bool:
    from radixserve.kernels import cpu_native

    return cpu_native.load()


class LoRAHolder:
    """The step's LoRA state as the model's layers read it (``step`` None: base only)."""

    def __init__(self) -> None:
        self.step: Optional[LoRAStep] = None
