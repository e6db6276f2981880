"""The detokenizer (``radixserve.detokenizer``): text held back while it could still become
a stop string, and a DetokState stream that never shows the stop string."""
from __future__ import annotations

from radixserve.detokenizer.incremental import safe_text_len
from radixserve.detokenizer.process import DetokState
from radixserve.ipc.server_link import ReqOutput
from radixserve.tokenizer import load_light_tokenizer


def test_safe_text_len_holds_back_stop_prefixes():
    assert safe_text_len("hello wor", ("world",)) == len("hello ")
    assert safe_text_len("hello world!", ("world",)) == len("hello ")
    assert safe_text_len("hello", ("xyz",)) == 5
    assert safe_text_len("abcab", ("abd", "x")) == 3
    assert safe_text_len("xxabc", ("abc", "b")) == 2


def test_detok_stream_never_shows_stop_string(tiny_dir):
    tok = load_light_tokenizer(tiny_dir)
    ids = tok.encode("The cat sat on the mat. The end.")
    state, shown = DetokState(tok, True, ("on the",)), ""
    for i, t in enumerate(ids):
        done = i == len(ids) - 1
        out = ReqOutput("r", [t], {"type": "stop", "matched": "on the"} if done else None)
        state.update(out)
        shown = out.final_text if done else shown + out.text
        assert "The cat sat ".startswith(shown), shown  # always a prefix of the final, trimmed text
    assert shown == "The cat sat "


def test_safe_text_len_bounds_catastrophic_stop_regex():
    """A partial search that backtracks exponentially times out: the text from ``start`` on
    is held back (the scheduler aborts the request)."""
    assert safe_text_len("a" * 60, (), (r"(a|aa)*\d",), start=3) <= 3
    assert safe_text_len("x" * 50 + "ab", ("abc",)) == 50  # the suffix search still finds stop prefixes
