"""The hierarchical cache's messages between the scheduler (owner of the tree, the pool's slots,
the host tier's slots and the disk tier's block table) and the model worker (owner of the
tensors behind all of them and of the block files).

One request, one reply, sent between steps: ``KVTierReq`` carries moves that the worker
carries out in order before it replies, so that once the reply is in, every source slot may be
reused and every destination slot holds its KV (a disk write is the exception: the worker
copies the rows out of the host tier before it replies and writes the file on a background
thread).  The reply names the moves that failed (a block that is missing, truncated, corrupt
or from another model: its destination slots hold nothing usable and the scheduler recomputes
those tokens) and every block whose background write failed since the last reply.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

import numpy as np

MoveKind = Literal["pool_to_host", "host_to_pool", "host_to_disk", "disk_to_pool", "drop_block", "prefetch_block"]


@dataclass
class TierMove:
    """One move.  ``src``/``dst``: int64 slots of the tier the kind names (pool or host),
    token for token.  Disk moves name a ``block`` (a file of the worker's storage folder):
    ``host_to_disk`` writes rows ``src`` with their ``tokens`` and ``salt`` as a new block;
    ``disk_to_pool`` reads rows ``offset .. offset + len(dst)`` of a block into ``dst``;
    ``drop_block`` deletes a block nobody references any more; ``prefetch_block`` starts reading a
    block on the worker's reader thread, so that a ``disk_to_pool`` soon after finds it in memory."""

    kind: MoveKind
    src: Optional[np.ndarray] = None
    dst: Optional[np.ndarray] = None
    block: str = ""
    offset: int = 0
    tokens: Optional[np.ndarray] = None
    salt: Optional[str] = None


@dataclass
class KVTierReq:
    moves: list[TierMove]


@dataclass
class KVTierReply:
    failed: list[int] = field(default_factory=list)  # indices of moves that did not happen
    lost_blocks: list[str] = field(default_factory=list)  # blocks whose write failed since the last reply
    message: str = ""
