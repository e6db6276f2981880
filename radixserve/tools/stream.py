"""One chat choice's text -> OpenAI ``content`` and ``tool_calls``, whole or as stream deltas.

``ToolCallStream.step(text, final)`` takes the cumulative output text and returns what to
send since the last step: a content fragment and ``delta.tool_calls`` entries shaped as the
OpenAI API sends them -- a call's first entry has ``index``, ``id``, ``type`` and
``function.name`` with the arguments known so far (possibly ""), later entries only
``index`` and an ``arguments`` fragment -- so that the ``openai`` package's stream
accumulators rebuild exactly the non-streamed message (``message``).  A call is announced
once its name is known; call ids are ``call_`` + 24 hex digits, fixed at announcement.
"""
from __future__ import annotations

import uuid
from typing import Any, Optional

from radixserve.tools.parsers import ToolParser


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


class ToolCallStream:
    def __init__(self, parser: ToolParser) -> None:
        self.parser = parser
        self.content_sent = 0
        self.ids: list[str] = []
        self.args_sent: list[int] = []
        self.calls = 0  # calls in the last parse

    def step(self, text: str, final: bool) -> tuple[str, list[dict[str, Any]]]:
        """(content fragment, tool_call delta entries) since the previous step."""
        parsed = self.parser.parse(text, final)
        self.calls = len(parsed.calls)
        content = parsed.content[self.content_sent:]
        self.content_sent = max(self.content_sent, len(parsed.content))
        deltas: list[dict[str, Any]] = []
        for i, call in enumerate(parsed.calls):
            if call.name is None:
                break
            args = call.visible_args
            if i == len(self.ids):
                self.ids.append(new_call_id())
                self.args_sent.append(len(args))
                deltas.append({"index": i, "id": self.ids[i], "type": "function",
                               "function": {"name": call.name, "arguments": args}})
            elif len(args) > self.args_sent[i]:
                deltas.append({"index": i, "function": {"arguments": args[self.args_sent[i]:]}})
                self.args_sent[i] = len(args)
        return content, deltas

    @property
    def called(self) -> bool:
        """Whether the last parse found a call."""
        return self.calls > 0

    def message(self, text: str) -> tuple[Optional[str], list[dict[str, Any]]]:
        """(content or None, tool_calls) of the finished ``text``, for a non-streamed response."""
        parsed = self.parser.parse(text, True)
        self.calls = len(parsed.calls)
        calls = []
        for i, call in enumerate(parsed.calls):
            if i == len(self.ids):
                self.ids.append(new_call_id())
            calls.append({"id": self.ids[i], "type": "function",
                          "function": {"name": call.name, "arguments": call.args}})
        content = parsed.content if parsed.content or not calls else None
        return content, calls


def finish_reason(reason: Optional[str], called: bool) -> Optional[str]:
    """OpenAI's ``tool_calls`` when a finished choice made calls (and was not cut by length)."""
    return "tool_calls" if called and reason == "stop" else reason
