"""The KV tensors: one K and one V buffer per layer, indexed by token slot."""
from __future__ import annotations

import torch


class KVPool:
    """``num_slots`` token slots per layer; slot 0 is a padding slot never allocated.

    Shapes: ``k_buffer[l]``/``v_buffer[l]`` are ``[num_slots, num_kv_heads, head_dim]``.
    """

    def __init__(
        self,
        num_slots: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> None:
        self.num_slots = num_slots
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        shape = (num_slots, num_kv_heads, head_dim)
        self.k_buffer = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v_buffer = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    def set_kv(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Scatter new keys/values ``[n, num_kv_heads, head_dim]`` into slots ``loc [n]``."""
        if k.dtype != self.dtype:  # (a no-op .to still costs a dispatch per layer)
            k, v = k.to(self.dtype), v.to(self.dtype)
        self.k_buffer[layer_id].index_copy_(0, loc, k)
        self.v_buffer[layer_id].index_copy_(0, loc, v)

    @staticmethod
    def bytes_per_slot(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * num_kv_heads * head_dim * torch.tensor([], dtype=dtype).element_size()
