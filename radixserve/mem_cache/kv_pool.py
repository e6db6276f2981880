"""The KV tensors: one K and one V buffer per layer, indexed by token slot."""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from radixserve.mem_cache import kv_quant


class KVPool:
    """``num_slots`` token slots per layer; slot 0 is a padding slot never allocated.

    Shapes: ``k_buffer[l]``/``v_buffer[l]`` are ``[num_slots, num_kv_heads, head_dim]``.
    ``shared_kv``: one tensor per layer is both K and V (``v_buffer[l] is k_buffer[l]``), for
    multi-head latent attention, whose keys and values are the same compressed vector; the
    memory is counted once and ``set_kv`` stores ``k`` only.
    ``sliding_layers`` with ``num_swa_slots``: those layers' buffers have ``num_swa_slots`` rows
    (the sliding-window pool, ``swa_slots.py``) and are indexed by sliding slots, which a step
    gives as ``ForwardBatch.swa_out_cache_loc``/``swa_req_to_token`` (``is_sliding[l]``).
    ``held_layers`` (a pipeline stage's layers; default all): the other layers' buffers have no rows.
    ``quant`` (``kv_quant.FORMATS``: int8, fp8_e4m3, fp8_e5m2): the buffers hold packed rows, uint8
    ``[num_slots, num_kv_heads, head_dim + 4]`` (codes and a scale per token and head); ``dtype`` is
    then the dtype K/V are given in and read back as (``set_kv``, ``read_kv``), ``store_dtype`` the
    buffers' own.  Code that copies rows between pools, tiers and files copies buffer rows as they
    are (``row_width`` elements of ``store_dtype`` per head); code that computes on them reads
    them through ``read_kv`` or a kernel that knows the packed form.
    """

    def __init__(
        self,
        num_slots: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        shared_kv: bool = False,
        sliding_layers: Sequence[int] = (),
        num_swa_slots: int = 0,
        quant: Optional[str] = None,
        held_layers: Optional[Sequence[int]] = None,
    ) -> None:
        self.num_slots = num_slots
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        self.shared_kv = shared_kv
        self.quant = quant if kv_quant.is_quantized(quant) else None
        if self.quant:
            kv_quant.check_head_dim(head_dim)
        self.store_dtype = torch.uint8 if self.quant else dtype
        self.row_width = kv_quant.packed_width(head_dim) if self.quant else head_dim
        self.num_swa_slots = num_swa_slots if sliding_layers else 0
        sliding = set(sliding_layers) if self.num_swa_slots else set()
        self.is_sliding = [layer in sliding for layer in range(num_layers)]
        # a pipeline stage's pool: the layers of other stages keep empty buffers (their ids stay global)
        self.held = set(range(num_layers)) if held_layers is None else set(held_layers)
        shapes = [((num_swa_slots if sliding else num_slots) if layer in self.held else 0, num_kv_heads,
                   self.row_width) for layer, sliding in enumerate(self.is_sliding)]
        self.k_buffer = [torch.zeros(shape, dtype=self.store_dtype, device=device) for shape in shapes]
        self.v_buffer = self.k_buffer if shared_kv else [torch.zeros(shape, dtype=self.store_dtype, device=device)
                                                         for shape in shapes]

    def set_kv(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Scatter new keys/values ``[n, num_kv_heads, head_dim]`` into slots ``loc [n]`` (with
        ``shared_kv``, ``v`` must equal ``k``: only ``k`` is stored; a quantized pool packs them)."""
        if self.quant:
            self.k_buffer[layer_id].index_copy_(0, loc, kv_quant.quantize(k, self.quant))
            if not self.shared_kv:
                self.v_buffer[layer_id].index_copy_(0, loc, kv_quant.quantize(v, self.quant))
            return
        if k.dtype != self.dtype:  # (a no-op .to still costs a dispatch per layer)
            k, v = k.to(self.dtype), v.to(self.dtype)
        self.k_buffer[layer_id].index_copy_(0, loc, k)
        if not self.shared_kv:
            self.v_buffer[layer_id].index_copy_(0, loc, v)

    def read_kv(self, layer_id: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``layer_id``'s K and V at ``slots [n]``, ``[n, num_kv_heads, head_dim]`` in ``dtype``
        (a copy; dequantized from a quantized pool)."""
        k = self.k_buffer[layer_id].index_select(0, slots)
        v = k if self.shared_kv else self.v_buffer[layer_id].index_select(0, slots)
        if self.quant:
            k = kv_quant.dequantize(k, self.quant, self.dtype)
            v = k if self.shared_kv else kv_quant.dequantize(v, self.quant, self.dtype)
        return k, v

    @property
    def hybrid(self) -> bool:
        """True when some layers are in the sliding-window pool."""
        return self.num_swa_slots > 0

    @property
    def total_bytes(self) -> int:
        """Bytes of every K/V buffer."""
        bufs = self.k_buffer if self.shared_kv else self.k_buffer + self.v_buffer
        return sum(b.numel() * b.element_size() for b in bufs)

    @property
    def slot_bytes(self) -> int:
        """Bytes one token slot takes over all layers (``bytes_per_slot`` of this pool)."""
        return self.bytes_per_slot(len(self.held), self.num_kv_heads, self.head_dim, self.dtype, self.shared_kv,
                                   self.quant)

    @staticmethod
    def bytes_per_slot(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                       shared_kv: bool = False, quant: Optional[str] = None) -> int:
        tensors = 1 if shared_kv else 2
        if kv_quant.is_quantized(quant):
            return tensors * num_layers * num_kv_heads * kv_quant.packed_width(head_dim)
        return tensors * num_layers * num_kv_heads * head_dim * torch.tensor([], dtype=dtype).element_size()
