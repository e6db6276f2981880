"""Dense linear layers on oneDNN's prepacked weights (the CPU path inductor uses when it freezes
a model).

``F.linear`` on the CPU hands oneDNN a plain ``[N, K]`` weight, and oneDNN reorders it into its
blocked layout inside every call; at decode-sized row counts that reorder is most of the call.
``torch.ops.mkldnn._reorder_linear_weight`` does it once at load time and
``torch.ops.mkldnn._linear_pointwise`` runs on the result.  Measured on the development machine
(Intel Xeon with AMX, 2 threads, SmolLM2's four decoder shapes, bf16): 269 -> 125 us at M = 1,
421 -> 286 us at M = 64, 965 -> 712 us at M = 256, equal at M = 1024; in fp32 it was no faster.
So whether a model packs its dense weights is measured like every other kernel choice
(``worker/tuning/kernel_timing.py``: paths "float32+packed" and "bfloat16+packed").

Contract: ``PackedLinear(weight, bias)(x)`` takes ``x [..., K]`` in the weight's dtype and returns
``F.linear(x, weight, bias)`` up to the GEMM's summation order.  The packed weight is an opaque
oneDNN tensor: the layer cannot be trained, moved or have its weight read back.
``pack_linears`` converts a loaded model in place.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch
from torch import nn

PACK_HINT = 64  # the row count oneDNN tunes the layout for; every M runs on it (64 measured best)


@functools.lru_cache(maxsize=None)
def available(dtype: torch.dtype) -> bool:
    """True when this torch build has oneDNN's packed linear for ``dtype`` and this CPU runs it.

    The build's ops are not enough: oneDNN's bf16 reorder refuses a CPU without AVX-512 (BW, VL,
    DQ) or AVX-NE-CONVERT ("bf16 path needs the cpu support ..."), so one tiny weight is packed
    and run once to find out."""
    if not (dtype in (torch.float32, torch.bfloat16) and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return False
    try:
        with torch.inference_mode():
            w = torch.zeros(16, 16, dtype=dtype)
            packed = torch.ops.mkldnn._reorder_linear_weight(w, PACK_HINT)
            torch.ops.mkldnn._linear_pointwise(torch.zeros(1, 16, dtype=dtype), packed, None, "none", [], "")
    except RuntimeError:
        return False
    return True


class PackedLinear(nn.Module):
    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.weight_dtype = weight.dtype
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), PACK_HINT)
        self.bias = None if bias is None else bias.detach().to(weight.dtype).contiguous()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, oneDNN packed {self.weight_dtype}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2 and x.is_contiguous():  # the model's [tokens, features]: no reshapes
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, self.in_features).contiguous(), self.packed, self.bias,
                                               "none", [], "")
        return y.reshape(*x.shape[:-1], self.out_features)


def pack_linears(model: nn.Module) -> int:
    """Replace every plain ``nn.Linear`` of ``model`` (CPU, fp32/bf16 weight; a QuantLinear's
    large-M ``dense`` layer included) by a PackedLinear, and give a ``LlamaForCausalLM`` a packed
    LM head (``lm_head_packed``; the tied embedding stays as it is).  Returns how many weights
    were packed."""
    done = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if name == "lm_head":  # read through lm_head_weight(); packed on its own below
                continue
            if type(child) is nn.Linear and child.weight.device.type == "cpu" and available(child.weight.dtype):
                setattr(module, name, PackedLinear(child.weight, child.bias))
                done += 1
    head = getattr(model, "lm_head_weight", None)
    quant_head_only = getattr(model, "lm_head_quant", None) is not None and getattr(model, "lm_head_max_m", 0) is None
    if head is not None and not quant_head_only:  # (a quantized head for every call needs no dense one)
        w = head()  # (None on a pipeline stage without the head)
        one_rank = getattr(getattr(model, "tp", None), "size", 1) == 1
        if w is not None and w.device.type == "cpu" and available(w.dtype) and one_rank:
            model.lm_head_packed = PackedLinear(w, None)
            done += 1
    return done
