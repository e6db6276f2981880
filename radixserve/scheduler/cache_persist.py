"""The scheduler side of warm restart (``--cache-persist-dir``).

``CachePersister`` picks the hottest cached prefixes and asks the worker to save their KV
(``save``: at shutdown with ``wait``; ``maybe_save`` every ``cache_persist_interval`` s from
the loop, between steps, where only the copy out of the KV tensors happens in the step gap
and the file is written on the worker's background thread), and at startup reserves free
slots, has the worker fill them from the file and inserts what it loaded into the tree
(``restore``).  Scheduler thread only; memory moves only through ``KVManager``.
"""
from __future__ import annotations

import hashlib
import logging
import math
import time
from typing import Callable, Optional, Protocol

from radixserve.config import CacheConfig
from radixserve.ipc.persist_link import KVRestoreReply, KVRestoreReq, KVSaveReply, KVSaveReq
from radixserve.scheduler.kv_manager import KVManager

logger = logging.getLogger(__name__)

RESTORE_SHARE = 0.5  # restored prefixes take at most this share of the free pool: the rest is for serving


class PrefixLink(Protocol):
    """The worker's end: ``RemoteWorker`` over ZeroMQ, or a ``PrefixStore`` in-process."""

    def save_prefixes(self, req: KVSaveReq) -> KVSaveReply: ...

    def restore_prefixes(self, req: KVRestoreReq) -> KVRestoreReply: ...


class CachePersister:
    def __init__(self, kv: KVManager, link: PrefixLink, cfg: CacheConfig, bytes_per_slot: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.kv, self.link, self.clock = kv, link, clock
        self.max_tokens = cfg.cache_persist_max_bytes // max(1, bytes_per_slot)
        self.interval = cfg.cache_persist_interval
        self.next_due = clock() + self.interval if self.interval > 0 else math.inf
        self.restored_tokens = 0
        self.last_save: Optional[KVSaveReply] = None
        self._saved: Optional[bytes] = None  # digest of what the last successful save sent

    def restore(self) -> KVRestoreReply:
        """Load the worker's file into reserved slots and the tree (before serving starts)."""
        slots = self.kv.reserve_for_restore(min(self.max_tokens, int(self.kv.free_slots() * RESTORE_SHARE)))
        reply = self.link.restore_prefixes(KVRestoreReq(slots))
        used = min(reply.used, len(slots))
        self.restored_tokens = self.kv.adopt(reply.nodes if used else [], slots, used)
        logger.info("warm restart: %s; %d tokens in the prefix cache", reply.message, self.restored_tokens)
        return reply

    def save(self, wait: bool = False, if_changed: bool = False) -> Optional[KVSaveReply]:
        """Send the hottest prefixes (at most the byte budget) to the worker to persist; with
        ``if_changed``, nothing (None) when they are the ones the last successful save sent."""
        nodes, slots = self.kv.hot_prefixes(self.max_tokens)
        digest = hashlib.sha256(slots.tobytes())
        for n in nodes:
            digest.update(repr((n.parent, n.salt)).encode() + n.tokens.tobytes())
        if if_changed and digest.digest() == self._saved:
            return None
        t0 = time.perf_counter()
        reply = self.link.save_prefixes(KVSaveReq(nodes, slots, wait))
        self.last_save = reply
        self._saved = digest.digest() if reply.ok else None
        if reply.ok:
            logger.info("persisting %d cached tokens (%d nodes, %.1f MiB of KV)%s; the scheduler waited %.3fs",
                        reply.num_tokens, len(nodes), reply.num_bytes / 2**20, "" if wait else " in the background",
                        time.perf_counter() - t0)
        else:
            logger.warning("prefix cache not persisted: %s", reply.message)
        return reply

    def maybe_save(self) -> Optional[KVSaveReply]:
        """``save`` when the interval is up and the hottest prefixes changed (call between steps)."""
        if self.clock() < self.next_due:
            return None
        self.next_due = self.clock() + self.interval
        return self.save(if_changed=True)
