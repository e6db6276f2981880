"""Request status and finish reasons: the vocabulary shared by the scheduler, the grammar
code and the output path.

This module sits below every package that handles requests (it imports nothing from
radixserve), so ``scheduler/`` and ``constrained/`` both depend on it and never on each
other's request types.
"""
from __future__ import annotations

import enum
from typing import Any


class FinishReason(dict):
    """SGLang's finish_reason shape: {type: stop|length|abort, matched|length|message}."""

    @classmethod
    def stop(cls, matched: Any) -> "FinishReason":
        return cls(type="stop", matched=matched)

    @classmethod
    def length(cls, length: int) -> "FinishReason":
        return cls(type="length", length=length)

    @classmethod
    def abort(cls, message: str) -> "FinishReason":
        return cls(type="abort", message=message)


class ReqStatus(enum.Enum):
    WAITING = 1
    RUNNING = 2
    FINISHED = 3
