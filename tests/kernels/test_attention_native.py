"""The torch-native backend: cascade (shared-prefix) path against the plain padded path
and against a per-request loop reference."""
from __future__ import annotations

import random

import pytest
import torch

from radixserve.attention.base import ForwardMode
from radixserve.attention.torch_native import TorchNativeBackend
from radixserve.mem_cache.kv_pool import KVPool

from tests.helpers.attention_cases import rows_case
from tests.helpers.attention_reference import attention_reference


@pytest.mark.parametrize("mode", [ForwardMode.EXTEND, ForwardMode.DECODE])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2), (8, 1)])
def test_cascade_matches_plain_and_reference(mode, heads, kv_heads):
    rng = random.Random(heads * 10 + mode.value)
    d, slots = 16, 4000
    pool = KVPool(slots, 1, kv_heads, d, torch.float32)
    free = list(range(1, slots))
    rng.shuffle(free)
    shared = [[free.pop() for _ in range(rng.randrange(40, 90))] for _ in range(3)]
    rows, prefix_lens, ext_lens = [], [], []
    for i in range(9):
        base = list(shared[i % 3][: rng.randrange(35, len(shared[i % 3]) + 1)]) if i < 8 else []
        own = [free.pop() for _ in range(rng.randrange(0, 20))]
        n = 1 if mode == ForwardMode.DECODE else rng.randrange(1, 12)
        rows.append(base + own + [free.pop() for _ in range(n)])
        prefix_lens.append(len(base) + len(own))
        ext_lens.append(n)
    batch, q = rows_case(pool, mode, rows, prefix_lens, ext_lens, heads, torch.Generator().manual_seed(0))
    k_new = pool.k_buffer[0][batch.out_cache_loc].clone()
    v_new = pool.v_buffer[0][batch.out_cache_loc].clone()
    backend = TorchNativeBackend(pool)
    outs = {}
    for use in (True, False):
        backend.use_cascade = use
        backend.init_forward_metadata(batch)
        assert any(b.cascade is not None for b in batch.attn_metadata) == use
        outs[use] = backend.forward(q, k_new, v_new, 0, d ** -0.5, batch)
    ref = attention_reference(q, pool.k_buffer[0], pool.v_buffer[0], batch, d ** -0.5)
    assert torch.allclose(outs[True], ref, atol=1e-5), "cascade vs reference (atol 1e-5)"
    assert torch.allclose(outs[False], ref, atol=1e-5), "plain vs reference (atol 1e-5)"


def test_length_buckets_bound_padding():
    from radixserve.attention.torch_native import length_buckets

    lens = [448, 64, 64, 1, 300, 64, 2, 130]
    buckets = length_buckets(lens)
    assert sorted(i for b in buckets for i in b) == list(range(len(lens)))
    for b in buckets:
        assert max(lens[i] for i in b) <= 2 * min(lens[i] for i in b)
