"""The disk tier: one block file per demoted tree node, in warm restart's checksummed format.

Contract: ``write`` returns at once (the rows are the caller's copies, kept in memory until
the background writer has written them, and served from there meanwhile); ``prefetch`` starts
reading a block on the reader thread (up to ``READ_AHEAD_BYTES`` of finished reads are kept);
``read`` returns the rows of a block (from memory when written or read ahead, waiting for a
read in flight) or None when the block is missing, truncated, corrupt or written for another
model (logged, never raised); ``drop`` deletes a block, also one still queued;
``lost()`` hands over the blocks whose write failed (disk full, the folder deleted: the folder
is made again for the next write).  The folder is this process's own, removed by ``close``.
"""
from __future__ import annotations

import glob
import logging
import os
import queue
import shutil
import threading
import uuid
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Optional

import numpy as np
import torch

from radixserve.ipc.persist_link import PersistNode
from radixserve.worker.persist.file_format import PrefixFileError, read_prefix_file, write_prefix_file

logger = logging.getLogger(__name__)

Rows = tuple[list[torch.Tensor], list[torch.Tensor]]  # per layer K and V, [n, kv_heads, head_dim]
READ_AHEAD_BYTES = 1 << 30  # finished read-aheads kept in memory at most (oldest dropped first)


PREFIX = "radixserve-hicache-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale(parent: str) -> None:
    """Delete block folders left by processes that are gone (a worker killed without ``close``)."""
    for path in glob.glob(os.path.join(parent, PREFIX + "*")):
        pid = os.path.basename(path)[len(PREFIX):].split("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


class BlockStore:
    def __init__(self, parent: str, fp: dict[str, Any]) -> None:
        remove_stale(parent)
        self.folder = os.path.join(parent, f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}")
        os.makedirs(self.folder, exist_ok=True)
        self.fp = fp
        self._lock = threading.Lock()
        self._pending: dict[str, tuple[np.ndarray, Optional[str], Rows]] = {}
        self._lost: list[str] = []
        self._queue: "queue.SimpleQueue[Any]" = queue.SimpleQueue()  # block names, flush events, None: stop
        self._thread = threading.Thread(target=self._run, name="hicache-writer", daemon=True)
        self._thread.start()
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="hicache-reader")
        self._reads: "OrderedDict[str, Future]" = OrderedDict()  # block -> its read (Rows and bytes, or None)

    def path(self, block: str) -> str:
        return os.path.join(self.folder, block + ".rsp")

    def write(self, block: str, tokens: np.ndarray, salt: Optional[str], rows: Rows) -> None:
        with self._lock:
            self._pending[block] = (tokens, salt, rows)
        self._queue.put(block)

    def _run(self) -> None:
        while (block := self._queue.get()) is not None:
            if isinstance(block, threading.Event):
                block.set()
                continue
            with self._lock:
                item = self._pending.get(block)
            if item is None:  # dropped before it was written
                continue
            tokens, salt, (k, v) = item
            try:
                os.makedirs(self.folder, exist_ok=True)
                write_prefix_file(self.path(block), self.fp, [PersistNode(-1, salt, tokens)], k, v)
            except OSError as e:
                logger.error("hierarchical cache: could not write block %s (%d tokens): %s", block, len(tokens), e)
                with self._lock:
                    self._lost.append(block)
            with self._lock:
                if self._pending.pop(block, None) is None:  # dropped while being written
                    self._unlink(block)

    def prefetch(self, block: str) -> None:
        with self._lock:
            if block in self._pending or block in self._reads:
                return
            self._reads[block] = self._reader.submit(self._load, block, True)
        self._trim()

    def _load(self, block: str, ahead: bool = False) -> Optional[tuple[Rows, int]]:
        try:
            f = read_prefix_file(self.path(block))
        except (PrefixFileError, OSError) as e:
            with self._lock:
                dropped = ahead and block not in self._reads
            if not dropped:  # a read-ahead of a block dropped meanwhile is nobody's loss
                logger.warning("hierarchical cache: block %s unreadable (%s); its tokens are recomputed", block, e)
            return None
        if f.fingerprint != self.fp:
            logger.warning("hierarchical cache: block %s was written for another model; recomputing", block)
            return None
        return (f.k, f.v), sum(t.numel() * t.element_size() for t in f.k + f.v)

    def read(self, block: str, offset: int, n: int) -> Optional[Rows]:
        with self._lock:
            item = self._pending.get(block)
            fut = self._reads.get(block)
        if item is not None:
            k, v = item[2]
        else:
            got = fut.result() if fut is not None else self._load(block)
            if got is None:
                return None
            k, v = got[0]
            if k and k[0].shape[0] < offset + n:
                logger.warning("hierarchical cache: block %s is shorter than the tree says; recomputing", block)
                return None
        self._trim()
        return [t[offset:offset + n] for t in k], [t[offset:offset + n] for t in v]

    def _trim(self) -> None:
        """Drop the oldest finished read-aheads beyond ``READ_AHEAD_BYTES``."""
        with self._lock:
            done = [(b, f.result()[1]) for b, f in self._reads.items() if f.done() and f.result() is not None]
            total = sum(size for _, size in done)
            for b, size in done:
                if total <= READ_AHEAD_BYTES:
                    break
                del self._reads[b]
                total -= size
            for b in [b for b, f in self._reads.items() if f.done() and f.result() is None]:
                del self._reads[b]

    def drop(self, block: str) -> None:
        with self._lock:
            queued = self._pending.pop(block, None) is not None
            self._reads.pop(block, None)
        if not queued:
            self._unlink(block)

    def _unlink(self, block: str) -> None:
        try:
            os.unlink(self.path(block))
        except FileNotFoundError:
            pass
        except OSError as e:
            logger.warning("hierarchical cache: could not delete block %s: %s", block, e)

    def lost(self) -> list[str]:
        with self._lock:
            out, self._lost = self._lost, []
        return out

    def flush(self, timeout: float = 60.0) -> None:
        """Wait until every block queued so far is written."""
        done = threading.Event()
        self._queue.put(done)
        done.wait(timeout)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=30)
        self._reader.shutdown(wait=True, cancel_futures=True)
        shutil.rmtree(self.folder, ignore_errors=True)
