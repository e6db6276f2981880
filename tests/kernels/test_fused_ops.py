"""The native CPU fused ops (kernels/cpu/fused_ops.cpp) against the torch reference ops."""
from __future__ import annotations

import pytest
import torch

from radixserve.kernels import cpu_native
from radixserve.model.cpu.fused_ops import NativeCpuOps, TorchOps, select_ops
from radixserve.model.layers.rotary import RotaryEmbedding

pytestmark = pytest.mark.skipif(not cpu_native.load(), reason="no C++ compiler: tests/kernels/test_attention_cpu.py covers the fallback")
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


@pytest.mark.parametrize("rows", [1, 9])
def test_add_rms_norm_keeps_an_fp32_residual_stream_under_bf16(rows):
    """A bf16 model's residual stream is fp32: the sum stays fp32 (not rounded to bf16), the
    normed output is bf16; native and torch agree, and a bf16 stream would differ."""
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 576, generator=g).bfloat16()
    res = torch.randn(rows, 576, generator=g) * 1e-3 + 3.0  # low bits that bf16 would lose
    w = (1 + 0.1 * torch.randn(576, generator=g)).bfloat16()
    want_r = res + x.float()
    for ops in (TorchOps, NativeCpuOps):
        n, r = ops.add_rms_norm(x.clone(), res.clone(), w, 1e-5)
        assert r.dtype == torch.float32 and n.dtype == torch.bfloat16
        torch.testing.assert_close(r, want_r, rtol=1e-6, atol=1e-6)
        assert (r - want_r.bfloat16().float()).abs().max() > 1e-4  # not rounded through bf16
        want_n = (w.float() * (want_r * torch.rsqrt(want_r.pow(2).mean(-1, keepdim=True) + 1e-5)))
        close(n, want_n.bfloat16(), torch.bfloat16)
    with pytest.raises(RuntimeError, match="residual of it or float32"):
        torch.ops.radixserve_cpu.add_rms_norm(x.float(), res.bfloat16(), w.float(), 1e-5)


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
@pytest.mark.parametrize("act", ["silu_mul", "gelu_tanh_mul"])
def test_gated_activations(dtype, rows, act):
    gu = (3 * torch.randn(rows, 2 * 1536, generator=torch.Generator().manual_seed(rows))).to(dtype)
    gu[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -0.0]).to(dtype)  # saturated exp, both signs
    close(getattr(NativeCpuOps, act)(gu), getattr(TorchOps, act)(gu), dtype)


def test_select_ops():
    assert select_ops(torch.device("cpu"), torch.float32) is NativeCpuOps
    assert select_ops(torch.device("cpu"), torch.float16) is TorchOps
    assert select_ops(torch.device("meta"), torch.float32) is TorchOps
