"""Embedding vectors as clients get them: the pooling names and the final normalization.

Shared by the server's ``/v1/embeddings`` and ``Engine.encode`` (so both give the same
numbers); light (numpy only).  The worker pools the served causal LM's final hidden state
(after the final norm): "last" (the last prompt token's) or "mean" (over every prompt
token); clients get it L2-normalized unless they ask ``normalize=False``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    import numpy as np

POOLINGS = ("last", "mean")


def check_pooling(value: Any, name: str = "pooling") -> str:
    """``value`` if it names a pooling, else ValueError naming ``name``."""
    if value not in POOLINGS:
        raise ValueError(f"{name}: must be one of {', '.join(POOLINGS)} (got {value!r})")
    return value


def finalize(vec: Optional[np.ndarray], normalize: bool = True) -> list[float]:
    """The vector a client gets: float32 values, L2-normalized (in float64) when ``normalize``."""
    import numpy as np  # here: the server's start does without numpy

    if vec is None:
        raise RuntimeError("the embedding request finished without a vector (aborted)")
    v = np.asarray(vec, dtype=np.float64)
    if normalize:
        v = v / max(float(np.linalg.norm(v)), 1e-12)
    return v.astype(np.float32).tolist()
