"""Greedy sampling's native row argmax (kernels/cpu/argmax.cpp) returns torch's
``max(dim=-1).indices``: the first maximal index, a row's first NaN when it has one."""
from __future__ import annotations

import pytest
import torch

from radixserve.kernels import cpu_native
from radixserve.worker.sampler import Sampler

pytestmark = pytest.mark.skipif(not cpu_native.load(), reason="no C++ compiler: the sampler uses torch's max")


def _rows() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(24, 49152, generator=g)
    x[1, [7, 40000]] = 50.0  # a tie: the first index wins
    x[2, 33] = float("nan")
    x[2, 20000] = float("nan")
    x[2, 5] = float("inf")
    x[3] = float("-inf")  # every value -inf: index 0
    x[4, -1] = 1e30  # the last element
    x[5, 0] = 1e30  # the first element
    x[6] = 0.0
    x[6, 9] = -0.0
    x[7, 17] = float("inf")
    x[7, 18] = float("inf")
    x[8, :] = 2.0  # all equal
    x[9, 49151] = float("nan")
    return x


def test_matches_torch_max_indices():
    x = _rows()
    got = torch.ops.radixserve_cpu.argmax_rows(x)
    assert got.dtype == torch.int64 and torch.equal(got, x.max(dim=-1).indices)
    assert got[1] == 7 and got[2] == 33 and got[3] == 0 and got[9] == 49151


@pytest.mark.parametrize("n", [1, 15, 16, 17, 1000])
def test_odd_widths_and_strided_rows(n):
    x = torch.randn(5, 2 * n, generator=torch.Generator().manual_seed(n))[:, :n]  # rows of stride 2n
    assert torch.equal(torch.ops.radixserve_cpu.argmax_rows(x), x.max(dim=-1).indices)


def test_a_wrong_variant_fails_the_check():
    """The check above tells the first maximal index from the last, and NaN-propagation from NaN-skipping."""
    x = _rows()
    ref = x.max(dim=-1).indices
    last_max = torch.tensor([int((row == row.max()).nonzero()[-1]) if not row.isnan().any() else 0 for row in x])
    assert not torch.equal(last_max, ref)
    nan_skipping = torch.nan_to_num(x, nan=float("-inf")).max(dim=-1).indices
    assert not torch.equal(nan_skipping, ref)


def test_sampler_uses_it_only_where_it_applies():
    s = Sampler(49152, torch.device("cpu"))
    x = _rows()
    assert s.native_argmax and torch.equal(s.argmax(x), x.max(dim=-1).indices)
    assert torch.equal(s.argmax(x.double()), x.double().max(dim=-1).indices)  # torch's path
    assert s.argmax(torch.empty(0, 49152)).shape == (0,)
    with pytest.raises(RuntimeError):
        torch.ops.radixserve_cpu.argmax_rows(torch.empty(3, 0))
