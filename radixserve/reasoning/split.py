"""A model's output text as (reasoning, answer), whole or streamed.

``split_reasoning(text, fmt, thinking, final)`` is a pure function of the cumulative text:

- ``thinking`` (the output starts inside the block): a leading start tag (after optional
  whitespace) is dropped; the reasoning is the text up to the first end tag, the answer everything
  after it.  With no end tag yet, all of it is reasoning (an output cut by ``max_tokens`` while
  thinking has an empty answer).
- not ``thinking``: the output thinks only if it starts (after optional whitespace) with the start
  tag; otherwise all of it is the answer and the reasoning is None.

Nothing is stripped around the tags (as SGLang and vLLM return them).  With ``final`` false the
split holds back what may still become a tag -- a trailing piece of the end tag while thinking, or
a start of output that may become the start tag -- so that as the text grows the reasoning and the
answer only grow: ``ReasoningStream`` turns them into deltas that never show a tag cut across two
of them, whatever the token boundaries.
"""
from __future__ import annotations

from typing import Optional

from radixserve.reasoning.formats import ReasoningFormat


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


def split_reasoning(text: str, fmt: ReasoningFormat, thinking: bool,
                    final: bool = True) -> tuple[Optional[str], str]:
    """(reasoning or None when the output does not think, answer) of the cumulative ``text``; see the
    module docstring for ``thinking`` and ``final``."""
    head = text.lstrip()
    if not final and len(head) < len(fmt.start) and fmt.start.startswith(head):
        return ("" if thinking else None), ""  # may still become the start tag
    if head.startswith(fmt.start):
        body = head[len(fmt.start):]
    elif thinking:
        body = text
    else:
        return None, text
    end = body.find(fmt.end)
    if end >= 0:
        return body[:end], body[end + len(fmt.end):]
    if not final:
        body = body[:len(body) - _partial_suffix(body, fmt.end)]
    return body, ""


class ReasoningStream:
    """One streamed choice: ``step(text, final)`` takes the cumulative output text and returns
    (the reasoning delta since the last step, the cumulative answer text so far)."""

    def __init__(self, fmt: ReasoningFormat, thinking: bool) -> None:
        self.fmt = fmt
        self.thinking = thinking
        self.sent = 0  # reasoning characters already returned

    def step(self, text: str, final: bool) -> tuple[str, str]:
        reasoning, answer = split_reasoning(text, self.fmt, self.thinking, final)
        reasoning = reasoning or ""
        delta = reasoning[self.sent:]
        self.sent = max(self.sent, len(reasoning))
        return delta, answer
