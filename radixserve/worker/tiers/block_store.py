"""The disk tier: one block file per demoted tree node, in warm restart's checksummed format.

Contract: ``write`` returns at once (the rows are the caller's copies, kept in memory until
the background writer has written them, and served from there meanwhile); ``read`` returns
the rows of a block or None when the block is missing, truncated, corrupt or written for
another model (logged, never raised); ``drop`` deletes a block, also one still queued;
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
from typing import Any, Optional

import numpy as np
import torch

from radixserve.ipc.persist_link import PersistNode
from radixserve.worker.persist.file_format import PrefixFileError, read_prefix_file, write_prefix_file

logger = logging.getLogger(__name__)

Rows = tuple[list[torch.Tensor], list[torch.Tensor]]  # per layer K and V, [n, kv_heads, head_dim]


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

    def read(self, block: str, offset: int, n: int) -> Optional[Rows]:
        with self._lock:
            item = self._pending.get(block)
        if item is not None:
            k, v = item[2]
            return [t[offset:offset + n] for t in k], [t[offset:offset + n] for t in v]
        try:
            f = read_prefix_file(self.path(block))
        except (PrefixFileError, OSError) as e:
            logger.warning("hierarchical cache: block %s unreadable (%s); its tokens are recomputed", block, e)
            return None
        if f.fingerprint != self.fp or f.num_tokens < offset + n:
            logger.warning("hierarchical cache: block %s does not match this model or is short; recomputing", block)
            return None
        return [t[offset:offset + n] for t in f.k], [t[offset:offset + n] for t in f.v]

    def drop(self, block: str) -> None:
        with self._lock:
            queued = self._pending.pop(block, None) is not None
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
        shutil.rmtree(self.folder, ignore_errors=True)
