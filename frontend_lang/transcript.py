"""The text of one program state and the chat messages it contains.

Role begin/end markers come from the chat template (``ChatTemplate.begin``/``end``), so a
program that writes only inside roles ends up with exactly the text
``apply_chat_template(messages)`` gives; text written outside roles is kept as is and is
not part of any message.  ``documents`` are the character ranges of ``text`` written as
documents (``append_document``; ``text`` only grows, so they stay valid).  Not thread-safe: the
owning executor guards it.
"""
from __future__ import annotations

import copy
from typing import Any, Optional

from frontend_lang.chat_template import ChatTemplate
from frontend_lang.errors import ProgramError


class Transcript:
    def __init__(self) -> None:
        self.text = ""
        self.messages: list[dict[str, Any]] = []
        self.documents: list[tuple[int, int]] = []  # (start, end) character ranges of ``text``
        self.role: Optional[str] = None  # the open role, if any
        self._content_start = 0  # where the open role's content begins in ``text``
        self._rendered = ""  # the template's rendering of ``messages``
        self._emitted_base = ""  # rendering + begin marker of the open role

    def copy(self) -> "Transcript":
        return copy.deepcopy(self)

    def append(self, text: str) -> None:
        self.text += text

    def append_document(self, text: str) -> None:
        """Append ``text`` and mark it as a document (an empty one marks nothing)."""
        start = len(self.text)
        self.text += text
        if text:
            self.documents.append((start, len(self.text)))

    def role_begin(self, role: str, template: ChatTemplate) -> None:
        if self.role is not None:
            raise ProgramError(f"role {role!r} begun inside role {self.role!r}; end that role first")
        marker = template.begin(self.messages, self._rendered, role)
        self.text += marker
        self.role = role
        self._content_start = len(self.text)
        self._emitted_base = self._rendered + marker

    def role_end(self, role: str, template: ChatTemplate) -> None:
        if self.role != role:
            raise ProgramError(f"role {role!r} ended but the open role is {self.role!r}")
        content = self.text[self._content_start:]
        marker, self._rendered = template.end(self.messages, self._emitted_base + content, role, content)
        self.text += marker
        self.messages.append({"role": role, "content": content})
        self.role = None
