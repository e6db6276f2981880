"""The native CPU fused ops (kernels/cpu/fused_ops.cpp) against the torch reference ops."""
from __future__ import annotations

import pytest
import torch

from radixserve.kernels import cpu_native
from radixserve.model.fused_ops import NativeCpuOps, TorchOps, select_ops
from radixserve.model.layers import RotaryEmbedding

pytestmark = pytest.mark.skipif(not cpu_native.load(), reason="no C++ compiler: tests/test_attention_cpu.py covers the fallback")
TOL = {torch.float32: 2e-6, torch.bfloat16: 1e-2}
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])


def close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> None:
    assert a.dtype == b.dtype == dtype and a.shape == b.shape
    err = ((a.float() - b.float()).abs() / (1 + b.float().abs())).max().item()
    assert err <= TOL[dtype], f"relative error {err:.3g}"


@DTYPES
@pytest.mark.parametrize("rows", [1, 7, 33])
def test_rms_norm_and_add(dtype, rows):
    g = torch.Generator().manual_seed(rows)
    x, res = torch.randn(rows, 576, generator=g).to(dtype), torch.randn(rows, 576, generator=g).to(dtype)
    w = (1 + 0.1 * torch.randn(576, generator=g)).to(dtype)
    close(NativeCpuOps.rms_norm(x, w, 1e-5), TorchOps.rms_norm(x, w, 1e-5), dtype)
    ref_n, ref_r = TorchOps.add_rms_norm(x.clone(), res.clone(), w, 1e-5)
    n, r = NativeCpuOps.add_rms_norm(x.clone(), res.clone(), w, 1e-5)
    close(r, ref_r, dtype)
    close(n, ref_n, dtype)


@DTYPES
def test_rope_in_place_on_strided_views(dtype):
    g = torch.Generator().manual_seed(1)
    heads, kv_heads, d, t = 9, 3, 64, 11
    rot = RotaryEmbedding(d, 4096, {"rope_theta": 100000.0, "rope_type": "default"})
    qkv = torch.randn(t, (heads + 2 * kv_heads) * d, generator=g).to(dtype)
    positions = torch.randint(0, 4000, (t,), generator=g)
    outs = []
    for ops in (TorchOps, NativeCpuOps):
        buf = qkv.clone()
        q, k, v = buf.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
        q, k = q.view(t, heads, d), k.view(t, kv_heads, d)
        ops.rope_(q, k, positions, rot.cos, rot.sin)
        outs.append(buf)
    close(outs[1], outs[0], dtype)
    assert torch.equal(outs[1][:, (heads + kv_heads) * d:], qkv[:, (heads + kv_heads) * d:]), "v untouched"


@DTYPES
@pytest.mark.parametrize("rows", [1, 5])
def test_silu_mul(dtype, rows):
    gu = (3 * torch.randn(rows, 2 * 1536, generator=torch.Generator().manual_seed(rows))).to(dtype)
    gu[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -0.0]).to(dtype)  # saturated exp, both signs
    close(NativeCpuOps.silu_mul(gu), TorchOps.silu_mul(gu), dtype)


def test_select_ops():
    assert select_ops(torch.device("cpu"), torch.float32) is NativeCpuOps
    assert select_ops(torch.device("cpu"), torch.float16) is TorchOps
    assert select_ops(torch.device("meta"), torch.float32) is TorchOps
