"""Server-side state of one in-flight sequence: an ``OutputState`` (the shared builder of the
native response) that notifies the waiting handler through its group queue.

``notify`` queues at most one pending notification per state, so a slow consumer sees the
latest cumulative state instead of a backlog.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Optional

from radixserve.output_state import OutputState


class RequestError(Exception):
    """An error for the client: HTTP ``status`` and a message that names the field."""

    def __init__(self, status: int, message: str, headers: Optional[dict[str, str]] = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


@dataclass
class ReqState(OutputState):
    group: Optional[asyncio.Queue] = None
    error: Optional[RequestError] = None
    dirty: bool = False
    detached: bool = False  # the client is gone; only waiting for the final message

    @property
    def done(self) -> bool:
        return self.finish_reason is not None or self.error is not None

    def notify(self) -> None:
        if self.group is not None and not self.dirty and not self.detached:
            self.dirty = True
            self.group.put_nowait(self)

    def fail(self, error: RequestError) -> None:
        self.error = error
        self.notify()
