"""Dry-run a program up to its first backend call to learn its constant leading text.

``traced_prefix`` runs the body on a state whose executor applies text and role ops at
once (roles rendered with the backend's chat template) and stops the body with
``StopTrace`` at the first op or read that would need the model: a gen, a select, a fork,
reading a variable or the text.  ``StopTrace`` derives from BaseException so a program's
own ``except Exception`` does not swallow it.  Used by run_batch's prefix hint.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Optional

from frontend_lang.backend.base import Backend
from frontend_lang.ir import ExprLike, RoleBegin, RoleEnd, Text, flatten
from frontend_lang.state import ProgramState
from frontend_lang.transcript import Transcript

logger = logging.getLogger(__name__)


class StopTrace(BaseException):
    """The traced program reached something that needs the model."""


class TraceExecutor:
    """Stands in for StreamExecutor during a trace; anything but writing text stops it."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.transcript = Transcript()

    def submit(self, expr: ExprLike) -> None:
        for op in flatten(expr):
            if isinstance(op, Text):
                self.transcript.append(op.text)
            elif isinstance(op, RoleBegin):
                self.transcript.role_begin(op.role, self.backend.chat_template())
            elif isinstance(op, RoleEnd):
                self.transcript.role_end(op.role, self.backend.chat_template())
            else:
                raise StopTrace()

    def __getattr__(self, name: str) -> Any:  # get_var, sync, fork, cond, ...: needs the model
        raise StopTrace()


def traced_prefix(func: Callable[..., Any], backend: Backend, kwargs: dict[str, Any]) -> Optional[str]:
    """The text ``func(s, **kwargs)`` writes before its first model call; None if the body
    raised an error of its own."""
    ex = TraceExecutor(backend)
    try:
        func(ProgramState(ex), **kwargs)  # type: ignore[arg-type]
    except StopTrace:
        pass
    except Exception as e:  # the real run will raise it again
        logger.debug("tracing %s failed: %s", getattr(func, "__name__", func), e)
        return None
    return ex.transcript.text
