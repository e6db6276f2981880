"""Point-to-point traffic between pipeline stages: hidden states forward, step results back.

Stage ``s`` is world ranks ``[s * tp, (s + 1) * tp)``; tensor-parallel rank ``i`` of stage ``s``
sends its hidden states to rank ``i`` of stage ``s + 1`` (every rank of a stage holds the
whole, all-reduced hidden states, so the pairs need no broadcast within a stage).  The last
stage's rank 0 (which samples) sends each micro-batch's result, pickled, to world rank 0
(stage 0's rank 0, the worker the scheduler talks to).

Sends are asynchronous (``isend``): a stage goes on with its next micro-batch while the last
one travels; ``flush`` waits for them (the tensors are kept alive until then).  Receives block.
Every failure -- a peer gone, or nothing within ``dist_timeout`` -- raises ``PeerLost``.
Traffic goes over the default group (NCCL on CUDA for the hidden states) and, for the
pickled results, over ``control`` (gloo; None: the default group on the CPU).
"""
from __future__ import annotations

import pickle
import time
from typing import Any, Callable

import torch
import torch.distributed as dist

from radixserve.parallel.group import PeerLost

_X, _RESIDUAL, _SIZE, _DATA = 1, 2, 3, 4  # tags


class StageLink:
    """The links of world rank ``world_rank`` (stage ``index`` of ``count``, ``tp`` ranks a stage)."""

    def __init__(self, world_rank: int, tp: int, count: int, control: Any = None) -> None:
        self.world_rank, self.tp, self.count = world_rank, tp, count
        self.index, self.tp_rank = divmod(world_rank, tp)
        self.control = control
        self.prev = world_rank - tp if self.index > 0 else None
        self.next = world_rank + tp if self.index < count - 1 else None
        self.last_leader = (count - 1) * tp  # samples and returns results
        self._pending: list[tuple[Any, Any]] = []  # (work, tensors kept alive until it completes)
        self.wait_s = 0.0  # seconds blocked in receives and flushes (the benchmark's bubble)

    @property
    def returns_results(self) -> bool:
        """True on the rank that sends each micro-batch's result to world rank 0."""
        return self.world_rank == self.last_leader

    # ---------------------------------------------------------------- hidden states
    def send_hidden(self, x: torch.Tensor, residual: torch.Tensor) -> None:
        """To the next stage: the last layer's output and the residual stream before it."""
        x, residual = x.contiguous(), residual.contiguous()
        self._isend(x, self.next, _X)
        self._isend(residual, self.next, _RESIDUAL)

    def recv_hidden(self, tokens: int, hidden: int, dtype: torch.dtype,
                    device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """From the previous stage: ``(x [tokens, hidden] in dtype, residual [tokens, hidden] fp32)``."""
        x = torch.empty(tokens, hidden, dtype=dtype, device=device)
        residual = torch.empty(tokens, hidden, dtype=torch.float32, device=device)
        self._timed(dist.recv, x, src=self.prev, tag=_X)
        self._timed(dist.recv, residual, src=self.prev, tag=_RESIDUAL)
        return x, residual

    # ---------------------------------------------------------------- results
    def send_result(self, obj: Any) -> None:
        """Last stage's rank 0: one micro-batch's result (picklable) to world rank 0."""
        data = torch.frombuffer(bytearray(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)), dtype=torch.uint8)
        self._isend(torch.tensor([data.numel()], dtype=torch.int64), 0, _SIZE, self.control)
        self._isend(data, 0, _DATA, self.control)

    def recv_result(self) -> Any:
        """World rank 0: the next micro-batch's result from the last stage."""
        n = torch.empty(1, dtype=torch.int64)
        self._timed(dist.recv, n, src=self.last_leader, tag=_SIZE, group=self.control)
        buf = torch.empty(int(n.item()), dtype=torch.uint8)
        self._timed(dist.recv, buf, src=self.last_leader, tag=_DATA, group=self.control)
        return pickle.loads(buf.numpy().tobytes())

    def flush(self) -> None:
        """Wait until every send of this step has gone."""
        pending, self._pending = self._pending, []
        t0 = time.perf_counter()
        try:
            for work, _ in pending:
                work.wait()
        except RuntimeError as e:
            raise PeerLost(f"pipeline send failed: {e}") from e
        finally:
            self.wait_s += time.perf_counter() - t0

    # ---------------------------------------------------------------- plumbing
    def _isend(self, t: torch.Tensor, dst: int, tag: int, group: Any = None) -> None:
        try:
            self._pending.append((dist.isend(t, dst=dst, tag=tag, group=group), t))
        except RuntimeError as e:
            raise PeerLost(f"pipeline send to rank {dst} failed: {e}") from e

    def _timed(self, fn: Callable[..., Any], t: torch.Tensor, **kw: Any) -> None:
        t0 = time.perf_counter()
        try:
            fn(t, **kw)
        except RuntimeError as e:
            raise PeerLost(f"pipeline receive from rank {kw.get('src')} failed: {e}") from e
        finally:
            self.wait_s += time.perf_counter() - t0
