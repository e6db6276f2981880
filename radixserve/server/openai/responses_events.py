"""A response's output items, built as its text grows, and the stream events that build them.

``OutputBuilder.step(text, final, status)`` takes the cumulative output text and appends the events
since the last step to ``events`` (each with its ``sequence_number``), in the order OpenAI's
Responses stream sends them and the ``openai`` client's accumulator expects:

- thinking (a reasoning parser): ``output_item.added`` (a ``reasoning`` item), ``content_part.added``
  (``reasoning_text``), ``reasoning_text.delta``..., then ``reasoning_text.done``,
  ``content_part.done``, ``output_item.done``;
- the answer: ``output_item.added`` (a ``message``), ``content_part.added`` (``output_text``),
  ``output_text.delta``..., then ``output_text.done``, ``content_part.done``, ``output_item.done``;
- each tool call (a tool parser): ``output_item.added`` (a ``function_call`` with empty
  ``arguments``), ``function_call_arguments.delta``..., ``function_call_arguments.done``,
  ``output_item.done``.

An item closes when the next one opens, or at the final step.  ``items`` are the output items
(the finished response's ``output``): a non-streamed response is one final step, so the streamed
and the whole response are built by the same code.  A response without calls has a message item,
empty if need be (unless it was cut while thinking).  Lifecycle events (``response.created``...)
go through ``emit`` so that the sequence numbers run on.
"""
from __future__ import annotations

from typing import Any, Optional

from radixserve.server.openai.reasoning import ChatReasoning
from radixserve.server.openai.responses_items import new_id
from radixserve.tools.parsers import ToolParser
from radixserve.tools.stream import ToolCallStream


class OutputBuilder:
    def __init__(self, parser: Optional[ToolParser], rsn: Optional[ChatReasoning]) -> None:
        self.items: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.seq = 0
        self.calls = ToolCallStream(parser) if parser is not None else None
        self.thoughts = rsn.stream() if rsn is not None else None
        self.open: Optional[int] = None  # the output index of the item being written
        self.call_index: dict[int, int] = {}  # tool call i -> its output index
        self.sent = 0  # answer characters already sent (without a tool parser)
        self.answer = ""  # the answer text (after the thinking)

    def emit(self, kind: str, **fields: Any) -> None:
        self.events.append({"type": kind, **fields, "sequence_number": self.seq})
        self.seq += 1

    def take(self) -> list[dict[str, Any]]:
        """The events since the last ``take``."""
        out, self.events = self.events, []
        return out

    def step(self, text: str, final: bool, status: str = "completed") -> None:
        """Events for the output ``text`` so far; ``final``: it is complete, and every item closes with
        ``status`` (``completed``, or ``incomplete`` when cut by the token limit)."""
        thought, answer = self.thoughts.step(text, final) if self.thoughts is not None else ("", text)
        self.answer = answer
        if thought:
            self._append("reasoning", thought)
        if self.calls is not None:
            content, deltas = self.calls.step(answer, final)
        else:
            content, deltas = answer[self.sent:], []
            self.sent = len(answer)
        if content:
            self._append("message", content)
        for d in deltas:
            self._call(d)
        if final:
            self._finish(status)

    # ---------------------------------------------------------------- items
    def _open(self, item: dict[str, Any]) -> int:
        self._close_open("completed")
        self.items.append(item)
        index = len(self.items) - 1
        self.emit("response.output_item.added", output_index=index, item=dict(item, content=[])
                  if "content" in item else dict(item, arguments="") if item["type"] == "function_call" else dict(item))
        return index

    def _append(self, kind: str, delta: str) -> None:
        if self.open is None or self.items[self.open]["type"] != kind:
            if kind == "reasoning":
                item = {"id": new_id("rs"), "type": "reasoning", "summary": [],
                        "content": [{"type": "reasoning_text", "text": ""}], "status": "in_progress"}
            else:
                item = {"id": new_id("msg"), "type": "message", "role": "assistant", "status": "in_progress",
                        "content": [{"type": "output_text", "text": "", "annotations": [], "logprobs": []}]}
            index = self._open(item)
            self.emit("response.content_part.added", item_id=item["id"], output_index=index, content_index=0,
                      part=dict(item["content"][0]))
            self.open = index
        item = self.items[self.open]
        item["content"][0]["text"] += delta
        if delta:
            name = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
            extra: dict[str, Any] = {} if kind == "reasoning" else {"logprobs": []}
            self.emit(name, item_id=item["id"], output_index=self.open, content_index=0, delta=delta, **extra)

    def _call(self, delta: dict[str, Any]) -> None:
        i, args = delta["index"], delta["function"].get("arguments", "")
        if "id" in delta:  # a new call: the item before it is complete
            self._close_open("completed")
            item = {"id": new_id("fc"), "type": "function_call", "call_id": delta["id"],
                    "name": delta["function"]["name"], "arguments": "", "status": "in_progress"}
            self.call_index[i] = self._open(item)
            self.open = self.call_index[i]
        index = self.call_index[i]
        if args:
            item = self.items[index]
            item["arguments"] += args
            self.emit("response.function_call_arguments.delta", item_id=item["id"], output_index=index, delta=args)

    def _close_open(self, status: str) -> None:
        if self.open is None:
            return
        index, self.open = self.open, None
        item = self.items[index]
        item["status"] = status
        if item["type"] == "function_call":
            self.emit("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                      name=item["name"], arguments=item["arguments"])
        else:
            part = item["content"][0]
            if item["type"] == "reasoning":
                self.emit("response.reasoning_text.done", item_id=item["id"], output_index=index, content_index=0,
                          text=part["text"])
            else:
                self.emit("response.output_text.done", item_id=item["id"], output_index=index, content_index=0,
                          text=part["text"], logprobs=[])
            self.emit("response.content_part.done", item_id=item["id"], output_index=index, content_index=0,
                      part=dict(part))
        self.emit("response.output_item.done", output_index=index, item=dict(item))

    def _finish(self, status: str) -> None:
        kinds = {it["type"] for it in self.items}
        if not kinds & {"message", "function_call"} and (status == "completed" or "reasoning" not in kinds):
            self._append("message", "")  # an empty answer is still a message
        self._close_open(status)

    @property
    def reasoning_text(self) -> Optional[str]:
        """The thinking of the output, None when it did not think."""
        texts = [it["content"][0]["text"] for it in self.items if it["type"] == "reasoning"]
        return "".join(texts) if texts else None
