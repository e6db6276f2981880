"""The tensor-parallel group a model and a worker talk through: ``NoTP`` or ``DistTP``.

The model calls ``all_reduce`` after each row-parallel matmul and ``gather_vocab`` on its
vocab-parallel logits; the worker process moves step plans with ``send``/``recv``.
``NoTP`` (tp_size 1) makes every call an identity, so the single-rank path runs no
collective and copies nothing.

``DistTP`` contracts: every rank calls the same collectives in the same order (they all run
the same step plan).  A collective that fails -- a peer process died, or nothing came for
``dist_timeout`` seconds -- raises ``PeerLost``, a ``BaseException`` so that the worker's
"one bad step must not take the worker down" handlers never swallow it: the rank exits.

Under pipeline parallelism (``pp_size > 1``) the world is every rank of every stage: ``rank``
and ``size`` are the rank's place in its stage's tensor-parallel ``group`` (a group of one
makes ``all_reduce``/``gather_vocab`` identities), while plans, ``min_int`` and
``from_leader`` span the world (``world_rank`` 0 leads); ``pipe`` is the stage's
``parallel.p2p.StageLink`` (None without a pipeline).
"""
from __future__ import annotations

import pickle
from typing import Any, Optional

import torch
import torch.distributed as dist


class PeerLost(BaseException):
    """A collective failed: another rank is gone or stuck.  The rank must exit."""


class NoTP:
    """One rank: every collective is the identity."""

    rank = 0
    size = 1
    is_leader = True
    world_rank = 0
    world_size = 1
    pipe = None

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def gather_vocab(self, logits: torch.Tensor, vocab_size: int) -> Optional[torch.Tensor]:
        return logits

    def min_int(self, n: int) -> int:
        return n

    def from_leader(self, obj: Any) -> Any:
        return obj


class DistTP:
    """A rank of the default ``torch.distributed`` group; ``control`` is the gloo group that
    carries plans and small host-side values (the default group itself on the CPU)."""

    def __init__(self, rank: int, size: int, control: Any = None, group: Any = None,
                 world_rank: Optional[int] = None, world_size: Optional[int] = None) -> None:
        self.rank, self.size = rank, size
        self.is_leader = rank == 0
        self.control = control
        self.group = group  # this stage's tensor-parallel group (None: the default group)
        self.world_rank = rank if world_rank is None else world_rank
        self.world_size = size if world_size is None else world_size
        self.leader = self.world_rank - rank  # the world rank of this group's rank 0
        self.pipe: Any = None

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the ranks, in place; returns it."""
        if self.size == 1:
            return x
        try:
            dist.all_reduce(x, group=self.group)
        except RuntimeError as e:
            raise PeerLost(f"all_reduce failed: {e}") from e
        return x

    def gather_vocab(self, logits: torch.Tensor, vocab_size: int) -> Optional[torch.Tensor]:
        """Rank 0: the full ``[M, vocab_size]`` logits from every rank's (padded) vocab shard
        ``[M, shard]``; the other ranks: None."""
        if self.size == 1:
            return logits
        parts = [torch.empty_like(logits) for _ in range(self.size)] if self.is_leader else None
        try:
            dist.gather(logits.contiguous(), parts, dst=self.leader, group=self.group)
        except RuntimeError as e:
            raise PeerLost(f"gather failed: {e}") from e
        return torch.cat(parts, dim=-1)[:, :vocab_size] if parts is not None else None

    def min_int(self, n: int) -> int:
        """The smallest ``n`` over the ranks (e.g. KV slots every rank can hold)."""
        t = torch.tensor([n], dtype=torch.int64)
        self._control(dist.all_reduce, t, op=dist.ReduceOp.MIN)
        return int(t.item())

    def from_leader(self, obj: Any) -> Any:
        """World rank 0's ``obj`` on every rank (picklable)."""
        if self.world_rank == 0:
            self.send(obj)
            return obj
        got = None
        while got is None:  # rank 0 sends nothing else while the ranks start
            got = self.recv()
        return got

    # ---------------------------------------------------------------- plans (rank 0 -> all)
    def send(self, obj: Any) -> None:
        """Rank 0: broadcast one picklable message; ``None`` is a keep-alive (nothing to do)."""
        data = b"" if obj is None else pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        self._exchange(len(data))
        if data:
            self._control(dist.broadcast, torch.frombuffer(bytearray(data), dtype=torch.uint8), src=0)

    def recv(self) -> Any:
        """Other ranks: the next message of rank 0, or None for a keep-alive."""
        n = self._exchange(0)
        if n == 0:
            return None
        buf = torch.empty(n, dtype=torch.uint8)
        self._control(dist.broadcast, buf, src=0)
        return pickle.loads(buf.numpy().tobytes())

    def _exchange(self, n: int) -> int:
        # an all-reduce (not a broadcast) so that rank 0 waits on every rank and notices a dead one
        t = torch.tensor([n], dtype=torch.int64)
        self._control(dist.all_reduce, t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def _control(self, fn: Any, t: torch.Tensor, **kw: Any) -> None:
        try:
            fn(t, group=self.control, **kw)
        except RuntimeError as e:
            raise PeerLost(f"{fn.__name__} failed: {e}") from e

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
