"""``--chat-template``: a Jinja chat template that replaces the tokenizer's, given as a file or, as
vLLM takes it, as the template text itself.

``load_chat_template`` reads and parses it once, when the arguments are parsed
(``ServerConfig``), so a missing file or a syntax error is one line naming the flag; the server
loads it again at start (``server/launcher.py``) and renders chats with it
(``server/openai/chat_encoder.py``).  Only the syntax is checked here: a template is rendered by
transformers, whose environment adds filters and the ``{% generation %}`` tag.
"""
from __future__ import annotations

import codecs

_JINJA_CHARS = "{}\n"  # vLLM's test: a value with none of these is meant as a path


def load_chat_template(value: str) -> str:
    """The template text of ``value`` (a file's path, or the template itself); ValueError
    ("chat_template: ...") when it is a path that cannot be read, empty, or not valid Jinja."""
    where = value  # the file, in an error
    try:
        with open(value, encoding="utf-8") as f:
            text = f.read()
    except (OSError, ValueError) as e:  # ValueError: a NUL in the "path", or the file is not UTF-8
        if not any(c in value for c in _JINJA_CHARS):
            reason = getattr(e, "strerror", None) or str(e)
            raise ValueError(f"chat_template: {value!r} is neither a readable file ({reason}) nor a Jinja "
                             "template") from None
        # the template itself; a shell-quoted "\n" stands for a newline (vLLM decodes escapes too)
        text = codecs.decode(value, "unicode_escape") if value.isascii() else value
        where = "the template given"
    if not text.strip():
        raise ValueError(f"chat_template: {where}: the template is empty")
    check_syntax(text, where)
    return text


def check_syntax(text: str, where: str = "the template given") -> None:
    """ValueError ("chat_template: WHERE: line N: ...") unless ``text`` parses as a Jinja template."""
    import jinja2  # here: only a server given a template pays for the import
    import jinja2.ext

    class Generation(jinja2.ext.Extension):  # transformers' {% generation %} ... {% endgeneration %}
        tags = {"generation"}

        def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.Scope(body, lineno=lineno)

    env = jinja2.Environment(extensions=["jinja2.ext.loopcontrols", Generation])
    try:
        env.parse(text)
    except jinja2.TemplateSyntaxError as e:
        raise ValueError(f"chat_template: {where}: line {e.lineno}: {e.message} (not a valid Jinja template)") from None
