"""The thinking formats ``--reasoning-parser`` names, after SGLang's reasoning parsers.

Every format here is a ``<think>`` ... ``</think>`` block before the answer; they differ in when the
output starts inside it:

- ``qwen3``: Qwen 3's hybrid models.  Thinking is on unless the chat template's ``enable_thinking``
  is false (the template then closes an empty block in the prompt); when on, the output is taken as
  thinking from its first token (SGLang's forced reasoning for a thinking request), with an optional
  leading ``<think>`` dropped.
- ``qwen3-thinking``: Qwen 3's thinking-only models (the template opens ``<think>``): always thinking.
- ``deepseek-r1``: DeepSeek-R1 and its distillations (the template ends with ``<think>\\n``): always
  thinking; everything up to ``</think>`` is reasoning.
- ``deepseek-v3``: DeepSeek-V3.1/3.2's hybrid template, thinking only with ``thinking: true``.

``thinking_enabled`` is SGLang's per-request rule (``_get_reasoning_from_request``); without
thinking, a leading ``<think>`` block the model writes anyway is still split off (``forced``
false), as SGLang's parsers do.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, get_args

from radixserve.config import ReasoningParserName


@dataclass(frozen=True)
class ReasoningFormat:
    """One thinking format: its tags; ``forced``: the output starts inside the block whatever the
    request says; ``switch``: the chat-template kwarg that turns thinking on or off (None: always on)
    and ``default_on``: whether it thinks when the request does not set the switch."""

    name: str
    forced: bool
    switch: Optional[str]
    default_on: bool
    start: str = "<think>"
    end: str = "</think>"


FORMATS: dict[str, ReasoningFormat] = {
    "qwen3": ReasoningFormat("qwen3", forced=False, switch="enable_thinking", default_on=True),
    "qwen3-thinking": ReasoningFormat("qwen3-thinking", forced=True, switch=None, default_on=True),
    "deepseek-r1": ReasoningFormat("deepseek-r1", forced=True, switch=None, default_on=True),
    "deepseek-v3": ReasoningFormat("deepseek-v3", forced=False, switch="thinking", default_on=False),
}
NAMES = tuple(n for n in get_args(ReasoningParserName) if n != "none")
assert set(NAMES) == set(FORMATS), "config.ReasoningParserName and FORMATS name the same formats"


def reasoning_format(name: str) -> ReasoningFormat:
    """The format ``name`` (a ``--reasoning-parser`` value); ValueError naming the known ones."""
    fmt = FORMATS.get(name.lower() if isinstance(name, str) else name)
    if fmt is None:
        raise ValueError(f"reasoning_parser: unknown reasoning parser {name!r} (known: {', '.join(NAMES)})")
    return fmt


def thinking_enabled(fmt: ReasoningFormat, template_kwargs: Optional[Mapping[str, Any]]) -> bool:
    """Whether a chat request thinks: always for a format without a switch, else the switch's value
    in ``template_kwargs`` (thinking only when it is ``True``), or the format's default when unset."""
    if fmt.switch is None:
        return True
    kwargs = template_kwargs or {}
    return kwargs[fmt.switch] is True if fmt.switch in kwargs else fmt.default_on


def think_token_ids(fmt: ReasoningFormat, tokenizer: Any) -> tuple[int, int]:
    """The (start, end) tag token ids under ``tokenizer``; ValueError, one line, when a tag is not a
    single token that decodes back to itself (the model cannot be this format's reasoning model)."""
    ids = []
    for tag in (fmt.start, fmt.end):
        enc = list(tokenizer.encode(tag, add_special_tokens=False))
        if len(enc) != 1:
            raise ValueError(f"reasoning_parser {fmt.name!r}: the tokenizer has no {tag} token ({tag!r} encodes to "
                             f"{len(enc)} tokens); this model does not think in {fmt.start}...{fmt.end} blocks")
        if tokenizer.decode(enc, skip_special_tokens=True) != tag:
            raise ValueError(f"reasoning_parser {fmt.name!r}: the tokenizer's {tag} token is a special token that "
                             f"decoding drops, so the thinking could not be told from the answer")
        ids.append(enc[0])
    return ids[0], ids[1]
