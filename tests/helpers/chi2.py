"""Pearson chi-square p-values without scipy (the survival function of chi2 is the
regularised upper incomplete gamma, ``torch.special.gammaincc``)."""
from __future__ import annotations

import torch


def _sf(stat: float, dof: int) -> float:
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def goodness_of_fit(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value of ``counts`` [C] drawn from ``probs`` [C] (categories of probability 0 must be empty)."""
    keep = probs > 0
    assert counts[~keep].sum() == 0, "a category of probability 0 was observed"
    expected = probs[keep].double() * counts.sum()
    stat = float(((counts[keep].double() - expected) ** 2 / expected).sum())
    return _sf(stat, int(keep.sum()) - 1)


def same_distribution(a: list, b: list, min_expected: float = 5.0) -> float:
    """Two-sample chi-square p-value that the categorical samples ``a`` and ``b`` share one
    distribution; categories too rare for the test are pooled into one."""
    cats = sorted(set(a) | set(b), key=repr)
    ca = torch.tensor([a.count(c) for c in cats], dtype=torch.float64)
    cb = torch.tensor([b.count(c) for c in cats], dtype=torch.float64)
    tot = ca + cb
    frac = len(a) / (len(a) + len(b))
    rare = tot * min(frac, 1 - frac) < min_expected
    if rare.any():
        ca = torch.cat([ca[~rare], ca[rare].sum().unsqueeze(0)])
        cb = torch.cat([cb[~rare], cb[rare].sum().unsqueeze(0)])
        tot = ca + cb
    keep = tot > 0
    ca, cb, tot = ca[keep], cb[keep], tot[keep]
    if len(tot) < 2:
        return 1.0
    ea, eb = tot * frac, tot * (1 - frac)
    stat = float(((ca - ea) ** 2 / ea).sum() + ((cb - eb) ** 2 / eb).sum())
    return _sf(stat, len(tot) - 1)
