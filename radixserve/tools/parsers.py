"""Tool-call parsers: model output text -> (content, calls), one parser per format.

Formats (``FORMATS``):
- ``hermes``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (Hermes 2 Pro,
  Qwen 2.5, and radixserve's default rendering, see prompt.py);
- ``llama3``: the whole message is ``{"name": ..., "parameters": {...}}`` (calls separated by
  ``;``), optionally after ``<|python_tag|>``;
- ``mistral``: ``[TOOL_CALLS]`` then a JSON array of ``{"name", "arguments"}`` objects;
- ``json``: the output of a ``tool_choice`` ``required``/named constraint: one call object, or
  an array of them.

Contract of ``ToolParser.parse(text, final)``: ``content`` is the text before the first call
(for ``final=False`` without the tail that may still become a call marker or whitespace, so
that what is streamed never has to be taken back: ``content`` only grows as ``text`` grows);
``calls`` are the calls so far, in order, ending at the first malformed call or one naming a
function not in ``names``.  With ``final=True`` only complete calls are kept, and when none
is, ``content`` is the whole text.  Text after the first call that is not a call is dropped.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from radixserve.tools.json_scan import DONE, INVALID, PARTIAL, CallText, scan_call, scan_calls, skip_ws

FORMATS = ("hermes", "llama3", "mistral", "json")
PYTHON_TAG = "<|python_tag|>"


@dataclass
class Parsed:
    content: str = ""
    calls: list[CallText] = field(default_factory=list)


def _held(text: str, marker: str) -> str:
    """``text`` without a tail that could be the start of ``marker``, nor trailing whitespace."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return text[:-k].rstrip()
    return text.rstrip()


class ToolParser:
    """Base: subclasses implement ``_calls`` (the calls starting right at ``start``)."""

    marker = ""

    def __init__(self, names: Optional[set[str]] = None) -> None:
        self.names = names  # None: any function name is accepted

    def _valid(self, call: CallText) -> bool:
        return call.status != INVALID and (call.name is None or self.names is None or call.name in self.names)

    def _calls(self, text: str, start: int) -> list[CallText]:
        raise NotImplementedError

    def _keep(self, calls: list[CallText]) -> list[CallText]:
        out = []
        for c in calls:
            if not self._valid(c):
                break
            out.append(c)
        return out

    def parse(self, text: str, final: bool) -> Parsed:
        idx = text.find(self.marker)
        if idx < 0:
            return Parsed(text if final else _held(text, self.marker))
        calls = self._keep(self._calls(text, idx + len(self.marker)))
        if final:
            calls = [c for c in calls if c.status == DONE]
            if not calls:
                return Parsed(text)
        return Parsed(text[:idx].rstrip(), calls)


class HermesParser(ToolParser):
    marker = "<tool_call>"
    close = "</tool_call>"

    def _calls(self, text: str, start: int) -> list[CallText]:
        calls: list[CallText] = []
        while True:
            call = scan_call(text, start)
            calls.append(call)
            if call.status != DONE:
                return calls
            i = skip_ws(text, call.end)
            if not text.startswith(self.close, i):
                if not self.close.startswith(text[i:]):  # neither the closing tag nor its start
                    call.status = INVALID
                return calls  # a call missing only its closing tag counts
            nxt = text.find(self.marker, i + len(self.close))
            if nxt < 0:
                return calls
            start = nxt + len(self.marker)


class MistralParser(ToolParser):
    marker = "[TOOL_CALLS]"

    def _calls(self, text: str, start: int) -> list[CallText]:
        return scan_calls(text, start)[0]


class JsonParser(ToolParser):
    """The constrained output: one call object or an array of them, from the first character."""

    def parse(self, text: str, final: bool) -> Parsed:
        calls = self._keep(scan_calls(text)[0])
        if final:
            calls = [c for c in calls if c.status == DONE]
            return Parsed("" if calls else text, calls)
        return Parsed("", calls)


class Llama3Parser(ToolParser):
    """Calls only when the whole message is calls (after an optional ``<|python_tag|>``);
    one malformed call, unknown name or trailing text makes all of it content."""

    def parse(self, text: str, final: bool) -> Parsed:
        i = skip_ws(text, 0)
        if text.startswith(PYTHON_TAG, i):
            i = skip_ws(text, i + len(PYTHON_TAG))
        elif not final and PYTHON_TAG.startswith(text[i:]):
            return Parsed("")  # may still become the tag (or is empty so far)
        if not final and i >= len(text):
            return Parsed("")
        if i >= len(text) or text[i] != "{":
            return Parsed(text)
        calls: list[CallText] = []
        while True:
            call = scan_call(text, i)
            calls.append(call)
            if call.status != DONE:
                break
            j = skip_ws(text, call.end)
            if j >= len(text):
                break
            if text[j] != ";":
                call.status = INVALID
                break
            i = j + 1
        if len(self._keep(calls)) < len(calls):
            return Parsed(text)
        if final:
            calls = [c for c in calls if c.status == DONE]
            if not calls:
                return Parsed(text)
        return Parsed("", calls)


_PARSERS: dict[str, type[ToolParser]] = {"hermes": HermesParser, "llama3": Llama3Parser,
                                        "mistral": MistralParser, "json": JsonParser}


def make_parser(fmt: str, names: Optional[set[str]] = None) -> ToolParser:
    """The parser of format ``fmt`` (one of ``FORMATS``), accepting calls to ``names``."""
    return _PARSERS[fmt](names)


def detect_format(template: Optional[str]) -> Optional[str]:
    """The tool-call format a chat template's source uses, None when it has no tool support."""
    if not template or ("tools" not in template and "tool_calls" not in template):
        return None
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<tool_call>" in template:
        return "hermes"
    if "<|python_tag|>" in template or '"parameters"' in template or "'parameters'" in template:
        return "llama3"
    return "hermes"  # <tool_call> (Qwen, Hermes) and templates without a recognizable format


__all__ = ["FORMATS", "Parsed", "ToolParser", "make_parser", "detect_format", "PARTIAL", "DONE"]
