"""Joining the tensor-parallel group: one ``torch.distributed`` rendezvous per rank.

``join(parallel, rank, device)`` returns ``NoTP`` for one rank (``tp_size * pp_size`` 1: no
rendezvous) and a ``DistTP`` otherwise; with ``pp_size > 1`` its ``group`` is the rank's stage
(a tensor-parallel group of its own when ``tp_size > 1``) and its ``pipe`` the stage's
``p2p.StageLink``.  Rank 0 listens at ``dist_init_addr`` (TCP, bound to that address
only: a loopback address is never reachable from outside); the rendezvous and every
collective time out after ``dist_timeout`` seconds.  Backend: gloo for CPU tensors, NCCL on
CUDA (each rank on ``cuda:<local rank>``, with a gloo group beside it for plans).  When the
address is a loopback one and ``GLOO_SOCKET_IFNAME`` is unset, gloo is bound to ``lo`` so
that ranks on one machine talk over loopback only.
"""
from __future__ import annotations

import datetime
import os
import socket
from typing import Any, Union

import torch

from radixserve.config import ParallelConfig
from radixserve.parallel.group import DistTP, NoTP

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def free_loopback_addr() -> str:
    """A "127.0.0.1:PORT" with a port that was free a moment ago (for a one-node rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def rank_device(device: torch.device, parallel: ParallelConfig, rank: int) -> torch.device:
    """The device of ``rank``: ``cuda:<local rank>`` on CUDA, else ``device`` itself."""
    if device.type != "cuda" or parallel.world_size == 1:
        return device
    return torch.device("cuda", rank - parallel.local_ranks().start)


def _store(host: str, port: int, rank: int, world: int, timeout: datetime.timedelta) -> Any:
    """The rendezvous store; rank 0 serves it on a socket bound to ``host`` itself (torch's own
    listener binds every interface)."""
    import torch.distributed as dist

    if rank != 0:
        return dist.TCPStore(host, port, world, False, timeout)
    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise RuntimeError(f"dist_init_addr: cannot listen on {host}:{port}: {e}") from e
    # the store owns the descriptor from here on (detach: Python must never close it)
    return dist.TCPStore(host, port, world, True, timeout, wait_for_workers=False, master_listen_fd=sock.detach(),
                         use_libuv=False)


def join(parallel: ParallelConfig, rank: int, device: torch.device) -> Union[NoTP, DistTP]:
    """Rendezvous as world ``rank`` of ``parallel.world_size``; raises RuntimeError/ValueError on
    failure (timeout, address in use) so that the rank's process exits non-zero."""
    world = parallel.world_size
    if world == 1:
        return NoTP()
    import torch.distributed as dist

    if not parallel.dist_init_addr:
        raise ValueError("dist_init_addr: needed to join a tensor- or pipeline-parallel group")
    host, _, port = parallel.dist_init_addr.rpartition(":")
    if host in LOOPBACK:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    timeout = datetime.timedelta(seconds=parallel.dist_timeout)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(rank_device(device, parallel, rank))
    store = _store(host.strip("[]"), int(port), rank, world, timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    control = dist.new_group(backend="gloo", timeout=timeout) if backend == "nccl" else None
    tp, pp = parallel.tp_size, parallel.pp_size
    if pp == 1:
        return DistTP(rank, tp, control)
    from radixserve.parallel.p2p import StageLink

    group = None
    if tp > 1:  # every rank creates every stage's group, in the same order
        for stage in range(pp):
            g = dist.new_group(list(range(stage * tp, (stage + 1) * tp)), timeout=timeout, backend=backend)
            group = g if stage == rank // tp else group
    grp = DistTP(rank % tp, tp, control, group, world_rank=rank, world_size=world)
    grp.pipe = StageLink(rank, tp, pp, control)
    return grp
