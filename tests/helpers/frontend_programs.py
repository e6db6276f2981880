"""Programs shared by the tests/test_frontend_*.py modules (their fixtures are in conftest.py)."""
from __future__ import annotations

from frontend_lang import assistant, function, gen, select, system, user

SYS = ("You are a careful assistant. Answer every question in one short sentence, cite no sources, "
       "and never apologise. Prefer plain words over jargon.")


@function
def chat(s, question, with_system=True):
    if with_system:
        s += system(SYS)
    s += user(question)
    with s.assistant():
        before = s.text()  # the prompt the gen sees
        s += gen("answer", max_tokens=6, temperature=0)
    with s.user():
        s += "Now pick "
        s += "a colour."
    s += assistant(select("colour", ["red", "green", "dark blue"]))
    return before


@function
def story(s):
    s += user("Tell me a story.")
    s += assistant(gen("story", max_tokens=24, temperature=0, ignore_eos=True))
    s += "After." + gen("after", max_tokens=4, temperature=0)
