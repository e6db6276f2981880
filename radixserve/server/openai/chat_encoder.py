"""Chat templates for the server process.

Only transformers' tokenizer renders a model's chat template, and importing transformers
(and torch) costs seconds of CPU, so ``ChatEncoder.preload`` loads it in a daemon thread
once the server is up; the first chat request waits for it if it is not ready yet.  The
rendered text is tokenized with the server's own (light) tokenizer, whose ids are the same.
Tools and tool messages: the template's own format when it has one, else the Hermes default
(radixserve/tools/prompt.py).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any, Optional

from radixserve.server.req_state import RequestError
from radixserve.tools.parsers import detect_format
from radixserve.tools.prompt import hermes_messages, hf_messages


class ChatEncoder:
    def __init__(self, tokenizer: Any, tokenizer_path: str) -> None:
        self.tokenizer = tokenizer
        self.tokenizer_path = tokenizer_path
        self._hf: Optional[asyncio.Future] = None

    def preload(self) -> None:
        """Start loading (idempotent); call from the event loop."""
        if self._hf is not None:
            return
        fut: concurrent.futures.Future = concurrent.futures.Future()
        if hasattr(self.tokenizer, "apply_chat_template"):
            fut.set_result(self.tokenizer)
        else:
            from radixserve.tokenizer import load_hf_tokenizer

            def load() -> None:
                try:
                    fut.set_result(load_hf_tokenizer(self.tokenizer_path))
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

    async def encode(self, messages: list[dict], tools: Optional[list[dict]] = None) -> list[int]:
        """Token ids of ``messages`` under the model's chat template (generation prompt added),
        with ``tools`` (OpenAI tool dicts) rendered in the template's own way when it has one,
        else as radixserve/tools/prompt.py's Hermes default; RequestError(400) naming ``messages`` when the
        template refuses them."""
        tok = await self._tokenizer()
        kw: dict[str, Any] = {}
        with_tools = bool(tools) or any(m.get("tool_calls") or m["role"] == "tool" for m in messages)
        if with_tools and detect_format(getattr(tok, "chat_template", None)) is None:
            messages = hermes_messages(messages, tools or [])
        elif with_tools:
            messages = hf_messages(messages)
            if tools:
                kw["tools"] = tools
        try:
            text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kw)
        except Exception as e:
            raise RequestError(400, f"messages: cannot apply the model's chat template ({e})") from None
        return self.tokenizer.encode(text, add_special_tokens=False)
