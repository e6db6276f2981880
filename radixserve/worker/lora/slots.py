"""``LoRASlots``: the adapters of a step, in ``max_loras_per_batch`` slots stacked per layer and
fused linear layer, so that one batch of rows over several adapters is three ops per layer
(``step.LoRAStep``).

Per layer and fused module (``qkv``: q/k/v; ``o``; ``gate_up``: gate/up; ``down``) a slot holds
``parts x R`` rows (``R`` = the largest rank served, smaller ranks zero-padded): ``A [S * parts *
R, in]`` (slot-major, then part, then rank) and ``B [S * parts * R, out]``, where the rows of part
``p`` hold that part's ``scale * B.T`` in the part's own output columns and zeros elsewhere.  So
``(x @ A[:k].T * mask) @ B[:k]`` over the first ``k`` slots adds, to each row, its own adapter's
delta on every part (the mask keeps each row's slot's columns).  A module no adapter targets is
all zeros in its slot (an exact no-op).

Host pool: every loaded adapter's fp32 weights (``adapter.load_weights``), by uid.  ``assign``
puts the step's adapters in slots: one already in a slot stays; a new one takes the lowest free
slot, else the least recently used slot no adapter of this step holds.  Worker thread only.
"""
from __future__ import annotations

import itertools

from collections import OrderedDict
from typing import Any, Optional

import torch

from radixserve.lora.adapter import AdapterInfo, load_weights

# fused module -> (the Hugging Face modules that are its parts, in output order)
FUSED = {"qkv": ("q_proj", "k_proj", "v_proj"), "o": ("o_proj",), "gate_up": ("gate_proj", "up_proj"),
         "down": ("down_proj",)}


def geometry(model: Any) -> dict[str, tuple[int, tuple[int, ...]]]:
    """``{fused module: (in features, out features of each part)}`` of the model's layers, or
    ValueError when its layers are not the plain decoder layer LoRA is built for."""
    from radixserve.model.layers.decoder import Attention
    from radixserve.model.layers.norm_mlp import GatedMLP

    layer = model.layers[0]
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    if type(attn) is not Attention or type(mlp) is not GatedMLP or model.layout.size != 1:
        raise ValueError(f"enable_lora: LoRA is served for the plain attention + gated-MLP decoder layer on one "
                         f"rank; {type(model).__name__} ({model.config.model_type}) has {type(attn).__name__} / "
                         f"{type(mlp).__name__}{' and tp_size > 1' if model.layout.size != 1 else ''}")
    hidden, inter = model.config.hidden_size, mlp.intermediate
    return {"qkv": (hidden, (attn.q_size, attn.kv_size, attn.kv_size)), "o": (attn.q_size, (hidden,)),
            "gate_up": (hidden, (inter, inter)), "down": (inter, (hidden,))}


class LoRASlots:
    def __init__(self, model: Any, num_slots: int, rank: int, targets: frozenset[str], dtype: torch.dtype,
                 device: torch.device) -> None:
        self.geometry = geometry(model)
        self.num_layers = len(model.layers)
        self.num_slots, self.rank, self.targets = num_slots, rank, targets
        self.dtype, self.device = dtype, device
        self.modules = [m for m, parts in FUSED.items() if targets & set(parts)]
        # each fused module's parts' column bounds in its output ([0, q, q + k, q + k + v] for qkv)
        self._cols = {m: torch.tensor([0, *itertools.accumulate(self.geometry[m][1])], dtype=torch.int64)
                      for m in FUSED}
        # (layer, fused module) -> (A, B)
        self.a: dict[tuple[int, str], torch.Tensor] = {}
        self.b: dict[tuple[int, str], torch.Tensor] = {}
        for lid in range(self.num_layers):
            for m in self.modules:
                fan_in, outs = self.geometry[m]
                rows = num_slots * len(outs) * rank
                self.a[lid, m] = torch.zeros(rows, fan_in, dtype=dtype, device=device)
                self.b[lid, m] = torch.zeros(rows, sum(outs), dtype=dtype, device=device)
        self.host: dict[str, dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]] = {}
        self.slot_of: dict[str, int] = {}  # uid -> slot
        self.lru: OrderedDict[int, str] = OrderedDict()  # slot -> uid, least recently used first

    # ------------------------------------------------------------------ host pool
    def load(self, name: str, path: str, field: str = "lora_path") -> AdapterInfo:
        """Read an adapter into the host pool (ValueError naming ``field`` when it does not fit)."""
        info, weights = load_weights(name, path, field, self.rank, self.targets)
        for (lid, module), (a, b) in weights.items():
            if lid >= self.num_layers:
                raise ValueError(f"{field}: {path!r} has weights for layer {lid}; the model has {self.num_layers}")
            fused = next(m for m, parts in FUSED.items() if module in parts)
            fan_in, outs = self.geometry[fused]
            out = outs[FUSED[fused].index(module)]
            if a.shape[1] != fan_in or b.shape[0] != out:
                raise ValueError(f"{field}: {path!r}: layer {lid} {module} is {b.shape[0]} x {a.shape[1]}; the "
                                 f"model's is {out} x {fan_in} (an adapter for another base model?)")
        self.host[info.uid] = weights
        return info

    def unload(self, uid: str) -> None:
        self.host.pop(uid, None)
        slot = self.slot_of.pop(uid, None)
        if slot is not None:
            self.lru.pop(slot, None)

    # ------------------------------------------------------------------ slots
    def assign(self, uids: list[str]) -> dict[str, int]:
        """Slots for the distinct ``uids`` of a step (at most ``num_slots``), loading those not in one."""
        want = list(dict.fromkeys(uids))
        if len(want) > self.num_slots:
            raise ValueError(f"max_loras_per_batch: a step with {len(want)} adapters; the slots hold {self.num_slots}")
        for uid in want:
            if uid not in self.host:
                raise KeyError(f"adapter {uid} is not loaded on this worker")
        out: dict[str, int] = {}
        for uid in want:
            slot = self.slot_of.get(uid)
            if slot is None:
                slot = self._free_slot(set(self.slot_of[u] for u in want if u in self.slot_of))
                self._fill(slot, uid)
            self.lru.move_to_end(slot)
            out[uid] = slot
        return out

    def _free_slot(self, busy: set[int]) -> int:
        used = set(self.lru)
        for s in range(self.num_slots):  # the lowest free slot keeps the used ones a short prefix
            if s not in used:
                return s
        for s, uid in self.lru.items():  # least recently used first
            if s not in busy:
                del self.slot_of[uid]
                return s
        raise AssertionError("no slot free: assign checked the count")

    def _fill(self, slot: int, uid: str) -> None:
        weights, r = self.host[uid], self.rank
        for lid in range(self.num_layers):
            for m in self.modules:
                _, outs = self.geometry[m]
                parts = len(outs)
                a = self.a[lid, m].view(self.num_slots, parts, r, -1)[slot]
                b = self.b[lid, m].view(self.num_slots, parts, r, -1)[slot]
                a.zero_()
                b.zero_()
                col = 0
                for p, (module, width) in enumerate(zip(FUSED[m], outs)):
                    w = weights.get((lid, module))
                    if w is not None:
                        rk = w[0].shape[0]
                        a[p, :rk].copy_(w[0])
                        b[p, :rk, col:col + width].copy_(w[1].t())
                    col += width
        self.slot_of[uid] = slot
        self.lru[slot] = uid

    def parts(self, module: str) -> int:
        return len(FUSED[module])

    def cols(self, module: str) -> torch.Tensor:
        """int64 [parts + 1]: the column bounds of ``module``'s parts in its output."""
        return self._cols[module]

    def slot_uid(self, slot: int) -> Optional[str]:
        return self.lru.get(slot)
