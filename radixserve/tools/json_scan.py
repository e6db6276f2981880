"""Incremental scanning of tool-call JSON in (possibly unfinished) model output.

``scan_call(text, i)`` reads a call object ``{"name": "...", "arguments": {...}}`` (or
``"parameters"``, Llama-3's key) starting at ``text[i]`` without requiring it to be complete,
and reports what is known so far: the name once its string closed, the raw text of the
arguments value (growing as the text grows), whether the object closed.  The raw text is
what the OpenAI API returns as ``function.arguments``, so streamed fragments concatenate to
exactly the non-streamed value.  ``scan_calls`` reads a JSON array of such objects (or a
single object).  Nothing here raises on malformed input: the status says ``invalid``.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Optional

ARG_KEYS = ("arguments", "parameters")
PARTIAL, DONE, INVALID = "partial", "done", "invalid"
_WS = " \t\r\n"


@dataclass
class CallText:
    """One call as far as the text goes.  ``args`` is raw JSON text (complete when
    ``args_done``); ``end`` is the index after the object (when ``status`` is DONE)."""

    name: Optional[str] = None
    args: str = ""
    args_done: bool = False
    status: str = PARTIAL
    end: int = 0

    @property
    def visible_args(self) -> str:
        """The arguments text that can be sent now (unfinished: without trailing whitespace)."""
        return self.args if self.args_done else self.args.rstrip(_WS)


def skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


_STRING_BODY = re.compile(r'[^"\\]*(?:\\.[^"\\]*)*"', re.S)  # the rest of a string, through its closing quote
_NESTED = re.compile(r'["{}\[\]]')  # what matters inside an object / array
_SCALAR_END = re.compile(r'[\s,\]}]')


def string_end(text: str, i: int) -> Optional[int]:
    """Index after the JSON string opening at ``text[i]`` (a quote); None if unfinished."""
    m = _STRING_BODY.match(text, i + 1)
    return None if m is None else m.end()


def value_end(text: str, i: int) -> tuple[str, int]:
    """(status, index after the JSON value starting at ``text[i]``); a bare scalar at the
    very end of the text is unfinished (more digits may follow)."""
    c = text[i]
    if c == '"':
        e = string_end(text, i)
        return (PARTIAL, len(text)) if e is None else (DONE, e)
    if c not in "{[":
        m = _SCALAR_END.search(text, i)
        if m is None:
            return PARTIAL, len(text)
        return (INVALID, i) if m.start() == i else (DONE, m.start())
    depth, j = 0, i
    while True:
        m = _NESTED.search(text, j)
        if m is None:
            return PARTIAL, len(text)
        j, c = m.start(), m.group()
        if c == '"':
            e = string_end(text, j)
            if e is None:
                return PARTIAL, len(text)
            j = e
            continue
        depth += 1 if c in "{[" else -1
        j += 1
        if depth == 0:
            return DONE, j


def scan_call(text: str, i: int, arg_keys: tuple[str, ...] = ARG_KEYS) -> CallText:
    """The call object starting at ``text[i]`` (leading whitespace allowed)."""
    call = CallText()
    i = skip_ws(text, i)
    if i >= len(text):
        return call
    if text[i] != "{":
        call.status = INVALID
        return call
    i, first = i + 1, True
    while True:
        i = skip_ws(text, i)
        if i >= len(text):
            return call
        if text[i] == "}":
            call.status, call.end = (DONE, i + 1) if call.name is not None and call.args_done else (INVALID, i)
            return call
        if not first:  # members are separated by commas
            if text[i] != ",":
                call.status = INVALID
                return call
            i = skip_ws(text, i + 1)
            if i >= len(text):
                return call
        first = False
        if text[i] != '"':
            call.status = INVALID
            return call
        e = string_end(text, i)
        if e is None:
            return call
        key = json.loads(text[i:e])
        i = skip_ws(text, e)
        if i >= len(text):
            return call
        if text[i] != ":":
            call.status = INVALID
            return call
        i = skip_ws(text, i + 1)
        if i >= len(text):
            return call
        status, e = value_end(text, i)
        if key in arg_keys:
            call.args = text[i:e]
            call.args_done = status == DONE
        if status != DONE:
            call.status = status
            return call
        if key == "name":
            try:
                name = json.loads(text[i:e])
            except ValueError:
                name = None
            if not isinstance(name, str):
                call.status = INVALID
                return call
            call.name = name
        elif key in arg_keys:
            try:
                json.loads(call.args)
            except ValueError:
                call.status = INVALID
                return call
        i = e


def scan_calls(text: str, i: int = 0) -> tuple[list[CallText], str]:
    """The calls of a JSON array of call objects (or of one call object) at ``text[i]``;
    (calls, status of the whole value).  An invalid call ends the list."""
    i = skip_ws(text, i)
    if i >= len(text):
        return [], PARTIAL
    if text[i] != "[":
        call = scan_call(text, i)
        return ([call] if call.status != INVALID else []), call.status
    calls: list[CallText] = []
    i += 1
    while True:
        i = skip_ws(text, i)
        if i >= len(text):
            return calls, PARTIAL
        if text[i] == "]":
            return calls, DONE
        if calls and text[i] == ",":
            i += 1
        call = scan_call(text, i)
        if call.status == INVALID:
            return calls, INVALID
        calls.append(call)
        if call.status == PARTIAL:
            return calls, PARTIAL
        i = call.end
