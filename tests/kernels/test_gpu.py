"""GPU-only attention checks: TritonBackend and FlashInferBackend vs TorchNativeBackend.

Run in its own pytest process on a CUDA machine::

    pytest tests/kernels/test_gpu.py -m gpu

tests/kernels/test_kernels.py sets TRITON_INTERPRET=1 for its whole process (its kernels run on
the CPU interpreter), so this module refuses to run in a process where that is set.
Skipped cleanly without CUDA; the flashinfer tests also skip without flashinfer.

Every check also compares against the fp32 loop-over-requests reference
(tests/helpers/attention_reference.py) computed from the very values in the pool, so a
failure says which side is off.
"""
import math
import os

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
_SEPARATE = ("TRITON_INTERPRET is set in this pytest process (tests/kernels/test_kernels.py sets it); "
             "run `pytest tests/kernels/test_gpu.py` in a separate process")


@pytest.fixture(autouse=True)
def _not_interpreted():
    """Checked when each test runs, not at collection: test_kernels.py, collected after
    this module, sets TRITON_INTERPRET for the whole process."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        pytest.skip(_SEPARATE)

from radixserve.attention.base import ForwardMode
from radixserve.attention.torch_native import TorchNativeBackend

from tests.helpers.attention_cases import assert_close, clone_pool, paged_batch, random_pool, random_qkv
from tests.helpers.attention_reference import attention_reference

DEV = torch.device("cuda")
# Against the fp32 reference (kernels accumulate in fp32; bf16/fp16 round P and the output).
TOL = {
    torch.float32: dict(atol=1e-3, rtol=1e-3),
    torch.float16: dict(atol=5e-3, rtol=5e-3),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
}
HEADS = {1: (8, 8), 3: (12, 4), 4: (16, 4), 8: (32, 4)}  # gqa -> (num_heads, num_kv_heads)
NUM_LAYERS = 2


def _close(out, ref, dtype, what, scale=1.0):
    assert_close(out, ref, what, **{k: v * scale for k, v in TOL[dtype].items()})


def make_steps(prefix, ext, num_kv_heads, head_dim, dtype, seed):
    """A pool with random prefixes at random slots, then (EXTEND batch, DECODE batch):
    the extend step appends ``ext`` tokens, the decode step one more per request."""
    g = torch.Generator().manual_seed(seed)
    bsz = len(prefix)
    final = [p + e + 1 for p, e in zip(prefix, ext)]
    num_slots = sum(final) + 1 + 64
    pool = random_pool(num_slots, NUM_LAYERS, num_kv_heads, head_dim, dtype, g, DEV)
    slots = torch.randperm(num_slots - 1, generator=g)[: sum(final)] + 1
    rows = torch.randperm(bsz + 5, generator=g)[:bsz]
    r2t = torch.zeros((bsz + 5, max(final) + 8), dtype=torch.int32)
    ext_loc, dec_loc, off = [], [], 0
    for i in range(bsz):
        r2t[rows[i], : final[i]] = slots[off: off + final[i]].int()
        ext_loc.append(slots[off + prefix[i]: off + final[i] - 1])
        dec_loc.append(slots[off + final[i] - 1: off + final[i]])
        off += final[i]
    r2t = r2t.to(DEV)
    extend = paged_batch(ForwardMode.EXTEND, r2t, rows, prefix, ext, torch.cat(ext_loc))
    seq = [p + e for p, e in zip(prefix, ext)]
    decode = paged_batch(ForwardMode.DECODE, r2t, rows, seq, [1] * bsz, torch.cat(dec_loc))
    return pool, extend, decode, g


def run_and_compare(make_backend, gqa, head_dim, dtype, seed, prefix, ext):
    num_heads, num_kv_heads = HEADS[gqa]
    pool, extend, decode, g = make_steps(prefix, ext, num_kv_heads, head_dim, dtype, seed)
    native_pool = clone_pool(pool)
    be, native = make_backend(pool), TorchNativeBackend(native_pool)
    scaling = 1.0 / math.sqrt(head_dim)
    for b in (extend, decode):
        be.init_forward_metadata(b)
        meta = b.attn_metadata
        native.init_forward_metadata(b)
        native_meta = b.attn_metadata
        for layer in range(NUM_LAYERS):
            q, k, v = random_qkv(b.num_tokens, num_heads, num_kv_heads, head_dim, dtype, g, DEV)
            b.attn_metadata = meta
            out = be.forward(q, k, v, layer, scaling, b)
            b.attn_metadata = native_meta
            ref_native = native.forward(q, k, v, layer, scaling, b)
            torch.cuda.synchronize()
            assert out.shape == q.shape and out.dtype == q.dtype
            for name in ("k_buffer", "v_buffer"):
                assert torch.equal(getattr(pool, name)[layer], getattr(native_pool, name)[layer]), (
                    f"{name}[{layer}] after {b.mode.name}: stored KV differs from KVPool.set_kv (exact)")
            ref = attention_reference(q, pool.k_buffer[layer], pool.v_buffer[layer], b, scaling)
            what = f"{type(be).__name__} {b.mode.name} layer {layer}"
            _close(out, ref, dtype, what + " vs fp32 reference")
            # torch_native on CUDA computes in the pool dtype: allow both sides' rounding.
            _close(out, ref_native, dtype, what + " vs torch_native", scale=2.0)


def _lens(seed, bsz=12):
    g = torch.Generator().manual_seed(seed)
    prefix = torch.randint(0, 700, (bsz,), generator=g).tolist()
    ext = torch.randint(1, 300, (bsz,), generator=g).tolist()
    prefix[0], ext[1], prefix[2] = 0, 1, 1500  # no prefix / single token / long context
    return prefix, ext


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("gqa,head_dim", [(1, 64), (3, 128), (8, 128), (4, 64)])
def test_triton_backend_cuda(gqa, head_dim, dtype):
    pytest.importorskip("triton")
    from radixserve.attention.triton_backend import TritonBackend

    run_and_compare(TritonBackend, gqa, head_dim, dtype, 100 + gqa + head_dim, *_lens(gqa))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])  # flashinfer: no fp32
@pytest.mark.parametrize("gqa,head_dim", [(1, 128), (4, 64), (8, 128)])
def test_flashinfer_backend(gqa, head_dim, dtype):
    pytest.importorskip("flashinfer")
    from radixserve.attention.flashinfer_backend import FlashInferBackend

    run_and_compare(FlashInferBackend, gqa, head_dim, dtype, 200 + gqa + head_dim, *_lens(10 + gqa))
