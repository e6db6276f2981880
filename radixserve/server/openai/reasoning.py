"""Reasoning models on /v1/chat/completions (docs/REASONING.md), with ``--reasoning-parser``.

``chat_template_kwargs`` (vLLM's and SGLang's) are variables of the chat template
(``template_kwargs`` refuses the names the server sets itself).  ``ChatReasoning.of`` reads the
request: whether it thinks (the format's template switch, ``reasoning.formats.thinking_enabled``)
and whether ``reasoning_content`` is split from ``content`` (SGLang's ``separate_reasoning``,
default true).  ``params`` sets ``require_reasoning`` from the switch (unless the request set it),
so that a ``response_format``, ``regex`` or tool-call constraint applies to the answer after the
thinking only, and checks ``thinking_token_budget``.  A response's message has ``reasoning_content``
(null when the output did not think) beside ``content``; streamed, the thinking comes as
``delta.reasoning_content`` and the answer as ``delta.content`` (radixserve/reasoning/split.py), as
vLLM and SGLang send them.  Tool calls are parsed from the answer only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from radixserve.reasoning.formats import ReasoningFormat, reasoning_format, thinking_enabled
from radixserve.reasoning.split import ReasoningStream, split_reasoning
from radixserve.server.req_state import RequestError

# apply_chat_template's own arguments: what the server passes, never a template variable of the request
RESERVED_TEMPLATE_KWARGS = ("conversation", "messages", "tools", "documents", "chat_template", "tokenize",
                            "add_generation_prompt", "continue_final_message", "return_dict", "padding",
                            "truncation", "max_length", "return_tensors", "return_assistant_tokens_mask",
                            "tokenizer_kwargs", "sanitize_control_tokens")


def template_kwargs(req: Any) -> Optional[dict[str, Any]]:
    """The request's ``chat_template_kwargs``; RequestError(400) naming a key the server sets itself."""
    kw = req.chat_template_kwargs
    for name in kw or {}:
        if name in RESERVED_TEMPLATE_KWARGS:
            raise RequestError(400, f"chat_template_kwargs.{name}: set by the server, not a template variable")
    return kw


@dataclass(frozen=True)
class ChatReasoning:
    """One chat request's reasoning: its format, whether it thinks, whether to split the output."""

    fmt: ReasoningFormat
    thinking: bool
    separate: bool

    @classmethod
    def of(cls, parser: str, req: Any) -> Optional["ChatReasoning"]:
        """None without a reasoning parser ("none")."""
        if parser == "none":
            return None
        fmt = reasoning_format(parser)
        return cls(fmt, thinking_enabled(fmt, req.chat_template_kwargs), req.separate_reasoning)

    @property
    def switch_name(self) -> str:
        return f"chat_template_kwargs.{self.fmt.switch}" if self.fmt.switch else "the reasoning parser"

    def params(self, params: dict[str, Any]) -> None:
        """Set ``require_reasoning`` in the sampling ``params`` from the request's thinking (unless
        given); RequestError(400) for a ``thinking_token_budget`` on a request that does not think."""
        params.setdefault("require_reasoning", self.thinking)
        if params.get("thinking_token_budget") is not None and not params["require_reasoning"]:
            raise RequestError(400, f"thinking_token_budget: this request does not think ({self.switch_name} "
                                    f"turns thinking off)")

    def split(self, text: str) -> tuple[Optional[str], str]:
        """(reasoning_content or None, content) of a finished output."""
        reasoning, answer = split_reasoning(text, self.fmt, self.thinking)
        return reasoning or None, answer

    def stream(self) -> ReasoningStream:
        return ReasoningStream(self.fmt, self.thinking)


def check_without_parser(params: dict[str, Any]) -> None:
    """RequestError(400) for a thinking budget on a server without a reasoning parser."""
    if params.get("thinking_token_budget") is not None:
        raise RequestError(400, "thinking_token_budget: this server has no reasoning parser (start it with "
                                "--reasoning-parser)")
