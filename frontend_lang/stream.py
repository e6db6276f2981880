"""``text_iter``: incremental text of a running program state (``run(stream=True)``).

Each step waits on the executor's condition variable until there is new text or the
stream is over, so it never spins and never hangs: it ends when the variable is final,
when the program ended and every op ran, or when an op failed (the error is raised after
the text produced so far).  Text that a finished gen trims away (a stop string that was
streamed before it matched) cannot be taken back; the variable's value has the trimmed text.
"""
from __future__ import annotations

from typing import Iterator, Optional

from frontend_lang.executor import StreamExecutor


def _snapshot(ex: StreamExecutor, name: Optional[str]) -> tuple[str, bool]:
    """(text so far, whether it is final); called with ``ex.cond`` held."""
    over = ex.error is not None or (ex.ended and ex.idle)
    if name is None:
        partial = ex.partial[1] if ex.partial is not None else ""
        return ex.transcript.text + partial, over
    if ex.is_pending(name):
        if ex.partial is not None and ex.partial[0] == name:
            return ex.partial[1], False
        return "", over
    if name in ex.variables:
        return str(ex.variables[name]), True
    return "", over


def text_iter(ex: StreamExecutor, name: Optional[str] = None) -> Iterator[str]:
    """Yield the new text of variable ``name`` (or of the whole state when None) as it grows."""
    sent = ""
    while True:
        with ex.cond:
            def ready() -> bool:
                text, final = _snapshot(ex, name)
                return final or (len(text) > len(sent) and text.startswith(sent))

            ex.cond.wait_for(ready)
            text, final = _snapshot(ex, name)
            error = ex.error
        if len(text) > len(sent) and text.startswith(sent):
            yield text[len(sent):]
            sent = text
        if final:
            if error is not None and (name is None or name not in ex.variables):
                raise error
            return
