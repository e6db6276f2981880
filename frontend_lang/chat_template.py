"""The model's chat template, rendered client-side with Jinja the way transformers does.

``ChatTemplate.render`` gives the same text as ``tokenizer.apply_chat_template(messages,
tokenize=False)`` (same sandbox, whitespace control, ``tojson``/``raise_exception``/
``strftime_now``, special-token variables).  ``begin``/``end`` compute the role markers for a
conversation built incrementally: each marker is the difference between renderings of the
conversation with a placeholder content, so context-dependent parts (a default system
prompt before the first user turn, say) come out exactly as the template makes them.
"""
from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any, Optional

# Used when the model ships no chat template (a base model): plain ChatML.
DEFAULT_TEMPLATE = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
                    " + '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
                    "{% endif %}")
PLACEHOLDER = "\x00frontend_lang-content\x00"


@lru_cache(maxsize=16)
def _compile(source: str) -> Any:
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(Extension):  # transformers' {% generation %} marks assistant text; render it as is
        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

        def _render(self, caller: Any) -> str:
            return caller()

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


class ChatTemplate:
    """A chat template plus the special-token strings it may reference (bos_token, ...)."""

    def __init__(self, template: Optional[str], special_tokens: Optional[dict[str, Any]] = None) -> None:
        self.source = template or DEFAULT_TEMPLATE
        self.special_tokens = dict(special_tokens or {})

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = False) -> str:
        """The template applied to ``messages`` (no tokenization)."""
        return _compile(self.source).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                            tools=None, documents=None, **self.special_tokens)

    def _with_placeholder(self, history: list[dict[str, Any]], role: str) -> tuple[str, str]:
        text = self.render([*history, {"role": role, "content": PLACEHOLDER}])
        head, sep, tail = text.partition(PLACEHOLDER)
        if not sep:
            raise ValueError(f"the chat template drops the content of a {role!r} message")
        return head, tail

    def begin(self, history: list[dict[str, Any]], rendered: str, role: str) -> str:
        """Text that opens a ``role`` message after ``history`` (whose rendering is ``rendered``)."""
        head, _ = self._with_placeholder(history, role)
        if head.startswith(rendered):
            return head[len(rendered):]
        common = 0  # the template re-renders earlier turns differently: emit what differs
        while common < min(len(head), len(rendered)) and head[common] == rendered[common]:
            common += 1
        return head[common:]

    def end(self, history: list[dict[str, Any]], emitted: str, role: str, content: str) -> tuple[str, str]:
        """(closing text of the message just written, rendering of history + that message).
        ``emitted`` is the rendering of ``history`` followed by the begin marker and ``content``."""
        message = {"role": role, "content": content}
        rendered = self.render([*history, message])
        if rendered.startswith(emitted):
            return rendered[len(emitted):], rendered
        _, tail = self._with_placeholder(history, role)  # the template rewrites the content (e.g. trims it)
        return tail, rendered
