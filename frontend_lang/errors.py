"""Exceptions of the frontend language.

A failed backend call (an HTTP 4xx/5xx, an invalid regex or schema, a server that cannot
be reached, an aborted request) becomes a ``BackendError`` carrying the server's message;
the program state stores it and raises it when a variable that op should have produced is
read (see ``ProgramState.__getitem__``).
"""
from __future__ import annotations

from typing import Optional


class FrontendError(Exception):
    """Base class of every error the frontend raises on purpose."""


class BackendError(FrontendError):
    """A backend call failed.  ``status`` is the HTTP status (None when the server could not
    be reached or the failure was local); ``message`` is the server's own message, which names
    the offending field (e.g. "sampling_params.regex: invalid regular expression: ...")."""

    def __init__(self, message: str, status: Optional[int] = None) -> None:
        super().__init__(message if status is None else f"[{status}] {message}")
        self.message = message
        self.status = status


class ProgramError(FrontendError):
    """A program used the language wrongly (e.g. a role ended that was never begun)."""
