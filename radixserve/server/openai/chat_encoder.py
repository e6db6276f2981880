"""Chat templates for the server process.

Only transformers' tokenizer renders a model's chat template, and importing transformers
(and torch) costs seconds of CPU, so ``ChatEncoder.preload`` loads it in a daemon thread
once the server is up; the first chat request waits for it if it is not ready yet.  The
rendered text is tokenized with the server's own (light) tokenizer, whose ids are the same.
Tools and tool messages: the template's own format when it has one, else the Hermes default
(radixserve/tools/prompt.py).  ``template`` (``--chat-template``) replaces the tokenizer's template.

Documents (a text part with ``"document": true``, issue 46): the template renders a unique
sentinel string in place of each document (``DocumentMarks``), the rendered prompt is split on
the sentinels, and the pieces are tokenized as segments (radixserve/tokenizer.py), so that a
document's tokens are exactly its own text's.  Messages without documents take the plain path.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import re
import threading
import uuid
from typing import Any, Optional

from radixserve.tokenizer import Segment, Spans, encode_segments
from radixserve.server.req_state import RequestError
from radixserve.tools.parsers import detect_format
from radixserve.tools.prompt import hermes_messages, hf_messages


class DocumentMarks:
    """Sentinel strings that stand in for a request's document parts while its chat template
    renders (``mark``), and the split of the rendered prompt back into segments (``segments``)."""

    def __init__(self) -> None:
        self.tag = f"<|radixserve-document-{uuid.uuid4().hex}-"
        self.docs: list[str] = []

    def mark(self, text: str) -> str:
        """The sentinel standing in for the document ``text``."""
        self.docs.append(text)
        return f"{self.tag}{len(self.docs) - 1}|>"

    def segments(self, rendered: str) -> list[Segment]:
        """``rendered`` as text and document segments; RequestError(400) naming ``messages`` when the
        template did not keep every sentinel exactly once."""
        parts = re.split(re.escape(self.tag) + r"(\d+)\|>", rendered)
        found = sorted(int(i) for i in parts[1::2])
        if found != list(range(len(self.docs))):
            raise RequestError(400, "messages: the chat template did not keep each document part exactly once "
                                    "(give the documents as content parts the template renders verbatim)")
        return [Segment(text=self.docs[int(p)], document=True) if k % 2 else Segment(text=p)
                for k, p in enumerate(parts)]


class ChatEncoder:
    def __init__(self, tokenizer: Any, tokenizer_path: str) -> None:
        self.tokenizer = tokenizer
        self.tokenizer_path = tokenizer_path
        self.template: Optional[str] = None  # --chat-template: replaces the tokenizer's (set before preload)
        self._hf: Optional[asyncio.Future] = None

    def _templated(self, tok: Any) -> Any:
        if self.template is not None:
            tok.chat_template = self.template
        return tok

    def preload(self) -> None:
        """Start loading (idempotent); call from the event loop."""
        if self._hf is not None:
            return
        fut: concurrent.futures.Future = concurrent.futures.Future()
        if hasattr(self.tokenizer, "apply_chat_template"):
            fut.set_result(self._templated(self.tokenizer))
        else:
            from radixserve.tokenizer import load_hf_tokenizer

            def load() -> None:
                try:
                    fut.set_result(self._templated(load_hf_tokenizer(self.tokenizer_path)))
                except BaseException as e:
                    fut.set_exception(e)

            # a daemon thread, not the loop's executor: shutting down never waits for this import
            threading.Thread(target=load, name="chat-tokenizer", daemon=True).start()
        self._hf = asyncio.wrap_future(fut)

    async def _tokenizer(self) -> Any:
        self.preload()
        return await asyncio.shield(self._hf)

    async def tool_format(self) -> str:
        """The tool-call format of the model's template (radixserve/tools/parsers.py), "hermes" when the
        template has no tool support (the default rendering, radixserve/tools/prompt.py)."""
        return detect_format(getattr(await self._tokenizer(), "chat_template", None)) or "hermes"

    async def encode(self, messages: list[dict], tools: Optional[list[dict]] = None,
                     continue_final: bool = False, *, template_kwargs: Optional[dict[str, Any]] = None) -> list[int]:
        """Token ids of ``messages`` under the model's chat template (generation prompt added, or with
        ``continue_final`` the last message left open to be continued), with ``tools`` (OpenAI tool dicts)
        rendered in the template's own way when it has one, else as radixserve/tools/prompt.py's Hermes
        default; RequestError(400) naming ``messages`` when the template refuses them.  ``template_kwargs``:
        the request's ``chat_template_kwargs``, variables of the template (``enable_thinking``, ...)."""
        text = await self.render(messages, tools, continue_final, template_kwargs=template_kwargs)
        return self.tokenizer.encode(text, add_special_tokens=False)

    async def encode_documents(self, messages: list[dict], tools: Optional[list[dict]], marks: DocumentMarks,
                               continue_final: bool = False, *, template_kwargs: Optional[dict[str, Any]] = None
                               ) -> tuple[list[int], Optional[Spans]]:
        """``encode`` for messages whose document parts are ``marks``' sentinels: the ids and the
        documents' spans (None when every document is empty)."""
        segments = marks.segments(await self.render(messages, tools, continue_final, template_kwargs=template_kwargs))

        def plain(text: str) -> list[int]:
            return self.tokenizer.encode(text, add_special_tokens=False)

        return encode_segments(segments, plain, plain)

    async def render(self, messages: list[dict], tools: Optional[list[dict]] = None,
                     continue_final: bool = False, *, template_kwargs: Optional[dict[str, Any]] = None) -> str:
        """The prompt text of ``messages`` (see ``encode``)."""
        tok = await self._tokenizer()
        kw: dict[str, Any] = dict(template_kwargs or {})  # the names the server sets are refused upstream
        with_tools = bool(tools) or any(m.get("tool_calls") or m["role"] == "tool" for m in messages)
        if with_tools and detect_format(getattr(tok, "chat_template", None)) is None:
            messages = hermes_messages(messages, tools or [])
        elif with_tools:
            messages = hf_messages(messages)
            if tools:
                kw["tools"] = tools
        if continue_final:  # SGLang's and vLLM's continue_final_message (transformers renders it)
            kw["continue_final_message"] = True
        try:
            text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=not continue_final, **kw)
        except Exception as e:
            if continue_final and "continue_final_message" in str(e):
                raise RequestError(400, "continue_final_message: cannot continue the final message with this chat "
                                        f"template ({str(e).splitlines()[0]})") from None
            if template_kwargs:  # the request's variables broke it (one shadows a template's function...)?
                own = {k: v for k, v in kw.items() if k not in template_kwargs}
                try:
                    tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=not continue_final, **own)
                except Exception:
                    pass
                else:
                    raise RequestError(400, f"chat_template_kwargs: the chat template fails with these variables "
                                            f"({e})") from None
            raise RequestError(400, f"messages: cannot apply the model's chat template ({e})") from None
        return text
