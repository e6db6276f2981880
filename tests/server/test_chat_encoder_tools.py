"""ChatEncoder with tools: a template with its own tool format gets ``tools=`` and calls with
object arguments; SmolLM2's template (no tool support) gets the Hermes rendering."""
from __future__ import annotations

import asyncio

import pytest

from radixserve.server.openai.chat_encoder import ChatEncoder
from radixserve.tools.prompt import hermes_messages

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
MSGS = [{"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "name": "f", "content": "ok"}]
# a Qwen-like template: tools as JSON, calls rendered from object arguments
OWN = ("{% if tools %}TOOLS:{% for t in tools %}{{ t.function.name }};{% endfor %}\n{% endif %}"
       "{% for m in messages %}<{{ m.role }}>{% if m.tool_calls %}{% for c in m.tool_calls %}"
       "<tool_call>{{ c.function.name }}:{{ c.function.arguments.a }}</tool_call>{% endfor %}"
       "{% else %}{{ m.content }}{% endif %}\n{% endfor %}<assistant>")


@pytest.fixture(scope="module")
def tok(smol_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smol_dir)


def render(tok, messages, tools) -> str:
    enc = ChatEncoder(tok, "")
    return tok.decode(asyncio.run(enc.encode(messages, tools)))


def test_template_with_its_own_tool_format(tok):
    own = tok.__class__.from_pretrained(tok.name_or_path)
    own.chat_template = OWN
    text = render(own, MSGS, TOOLS)
    assert text == "TOOLS:f;<user>hi<assistant><tool_call>f:1</tool_call><tool>ok<assistant>"  # trim_blocks
    assert asyncio.run(ChatEncoder(own, "").tool_format()) == "hermes"


def test_template_without_tools_gets_hermes(tok):
    text = render(tok, MSGS, TOOLS)
    assert text == tok.apply_chat_template(hermes_messages(MSGS, TOOLS), tokenize=False, add_generation_prompt=True)
    assert "<tools>" in text and "<tool_response>\nok\n</tool_response>" in text
    assert render(tok, MSGS[:1], None) == tok.apply_chat_template(MSGS[:1], tokenize=False,
                                                                  add_generation_prompt=True)
