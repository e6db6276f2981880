"""The torch-native backend: cascade (shared-prefix) path against the plain padded path
and against a per-request loop reference."""
from __future__ import annotations

import random

import pytest
import torch

from radixserve.attention.base import ForwardBatch, ForwardMode
from radixserve.attention.torch_native import TorchNativeBackend
from radixserve.mem_cache.kv_pool import KVPool

from tests.helpers.attention_reference import attention_reference


@pytest.mark.parametrize("mode", [ForwardMode.EXTEND, ForwardMode.DECODE])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2), (8, 1)])
def test_cascade_matches_plain_and_reference(mode, heads, kv_heads):
    rng = random.Random(heads * 10 + mode.value)
    torch.manual_seed(0)
    d, slots = 16, 4000
    pool = KVPool(slots, 1, kv_heads, d, torch.float32)
    free = list(range(1, slots))
    rng.shuffle(free)
    shared = [[free.pop() for _ in range(rng.randrange(40, 90))] for _ in range(3)]
    rows, prefix_lens, ext_lens, new_slots = [], [], [], []
    for i in range(9):
        base = list(shared[i % 3][: rng.randrange(35, len(shared[i % 3]) + 1)]) if i < 8 else []
        own = [free.pop() for _ in range(rng.randrange(0, 20))]
        n = 1 if mode == ForwardMode.DECODE else rng.randrange(1, 12)
        new = [free.pop() for _ in range(n)]
        rows.append(base + own + new)
        prefix_lens.append(len(base) + len(own))
        ext_lens.append(n)
        new_slots += new
    all_slots = torch.tensor(sorted({s for r in rows for s in r}))
    pool.k_buffer[0][all_slots] = torch.randn(len(all_slots), kv_heads, d)
    pool.v_buffer[0][all_slots] = torch.randn(len(all_slots), kv_heads, d)
    table = torch.zeros(len(rows), 200, dtype=torch.int32)
    for i, r in enumerate(rows):
        table[i, : len(r)] = torch.tensor(r, dtype=torch.int32)
    t = sum(ext_lens)
    q = torch.randn(t, heads, d)
    k_new = pool.k_buffer[0][torch.tensor(new_slots)].clone()
    v_new = pool.v_buffer[0][torch.tensor(new_slots)].clone()
    lens = torch.tensor(ext_lens)
    pre = torch.tensor(prefix_lens)
    batch = ForwardBatch(mode, torch.zeros(t, dtype=torch.long), torch.zeros(t, dtype=torch.long),
                         torch.tensor(new_slots), torch.arange(len(rows)), pre + lens, pre, lens,
                         torch.cumsum(lens, 0) - lens, table, (pre + lens).tolist(), prefix_lens, ext_lens)
    backend = TorchNativeBackend(pool)
    outs = {}
    for use in (True, False):
        backend.use_cascade = use
        backend.init_forward_metadata(batch)
        assert any(b.cascade is not None for b in batch.attn_metadata) == use
        outs[use] = backend.forward(q, k_new, v_new, 0, d ** -0.5, batch)
    ref = attention_reference(q, pool, rows, prefix_lens, ext_lens, d ** -0.5)
    assert torch.allclose(outs[True], ref, atol=1e-5), "cascade vs reference (atol 1e-5)"
    assert torch.allclose(outs[False], ref, atol=1e-5), "plain vs reference (atol 1e-5)"


def test_length_buckets_bound_padding():
    from radixserve.attention.torch_native import length_buckets

    lens = [448, 64, 64, 1, 300, 64, 2, 130]
    buckets = length_buckets(lens)
    assert sorted(i for b in buckets for i in b) == list(range(len(lens)))
    for b in buckets:
        assert max(lens[i] for i in b) <= 2 * min(lens[i] for i in b)
