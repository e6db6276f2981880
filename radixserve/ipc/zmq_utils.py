"""ZeroMQ plumbing shared by every process: ipc:// endpoints, sockets and the codec.

Contract: every message is one pickled dataclass (``send_obj`` / ``recv_obj``).  The
receiving side of each PUSH/PULL link binds and the sending side connects, so processes
can start in any order (messages sent before the peer binds wait in the sender's queue).
Sockets use linger 0, so closing never blocks on a dead peer.
"""
from __future__ import annotations

import os
import pickle
from dataclasses import dataclass
from typing import Any

import zmq


@dataclass(frozen=True)
class IPCAddrs:
    """The five one-way links of the runtime (receiver binds)."""

    server_to_sched: str
    sched_to_worker: str
    worker_to_sched: str
    sched_to_detok: str
    detok_to_server: str

    @classmethod
    def in_dir(cls, folder: str) -> "IPCAddrs":
        def addr(name: str) -> str:
            return "ipc://" + os.path.join(folder, name)

        return cls(addr("server_to_sched"), addr("sched_to_worker"), addr("worker_to_sched"),
                   addr("sched_to_detok"), addr("detok_to_server"))


def make_socket(ctx: zmq.Context, kind: int, addr: str, bind: bool) -> zmq.Socket:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    if kind == zmq.PULL:
        sock.setsockopt(zmq.RCVHWM, 0)
    if kind == zmq.PUSH:
        sock.setsockopt(zmq.SNDHWM, 0)
    if bind:
        sock.bind(addr)
    else:
        sock.connect(addr)
    return sock


def send_obj(sock: zmq.Socket, obj: Any) -> None:
    sock.send(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), copy=False)


def recv_obj(sock: zmq.Socket) -> Any:
    """Block for one message."""
    return pickle.loads(sock.recv())


def drain(sock: zmq.Socket) -> list[Any]:
    """Every message that is already waiting, without blocking."""
    out = []
    while True:
        try:
            out.append(pickle.loads(sock.recv(zmq.NOBLOCK)))
        except zmq.Again:
            return out
