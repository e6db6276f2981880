"""Finish conditions: EOS, stop token ids, max_new_tokens, stop strings and stop regexes.

Stop strings and ``stop_regex`` patterns are matched on the decoded tail of the output, so
a match that spans a token boundary is found; the text trim happens where the output text
is assembled (``detokenizer/incremental.py``).  The tail is as many tokens as the longest
stop string has characters (+2), or as the longest text a regex can match (+2; the whole
output for an unbounded one such as ``\\d+``), since a token decodes to at least one
character in practice (as SGLang bounds it).
"""
from __future__ import annotations

import functools
from typing import Any, Optional

from radixserve.request import FinishReason
from radixserve.sampling_params import STOP_REGEX_TIMEOUT_S, search_stop_regex
from radixserve.scheduler.req import Req

try:  # Python >= 3.11
    import re._parser as sre_parse
except ImportError:  # pragma: no cover
    import sre_parse  # type: ignore[no-redef]

UNBOUNDED = 1 << 30


def _max_len(parsed: Any) -> int:
    """Upper bound of the characters a parsed (sre) pattern can match."""
    total = 0
    for op, value in parsed:
        if op in (sre_parse.LITERAL, sre_parse.NOT_LITERAL, sre_parse.IN, sre_parse.ANY):
            total += 1
        elif op == sre_parse.SUBPATTERN:
            total += _max_len(value[-1])
        elif op == sre_parse.BRANCH:
            total += max(_max_len(b) for b in value[1])
        elif op in (sre_parse.MAX_REPEAT, sre_parse.MIN_REPEAT, getattr(sre_parse, "POSSESSIVE_REPEAT", None)):
            lo, hi, sub = value
            total += UNBOUNDED if hi == sre_parse.MAXREPEAT else hi * _max_len(sub)
        elif op in (sre_parse.AT, sre_parse.ASSERT, sre_parse.ASSERT_NOT):
            continue  # zero width
        else:
            return UNBOUNDED  # back-references, conditionals...: no bound
        total = min(total, UNBOUNDED)
    return total


@functools.lru_cache(maxsize=1024)
def regex_max_len(pattern: str) -> int:
    """The most characters ``pattern`` can match (``UNBOUNDED`` when it has no bound)."""
    try:
        return _max_len(sre_parse.parse(pattern))
    except Exception:  # a pattern only the ``regex`` module parses
        return UNBOUNDED


class StopChecker:
    def __init__(self, eos_ids: tuple[int, ...], tokenizer: Optional[Any]) -> None:
        self.eos_ids = eos_ids
        self.tokenizer = tokenizer

    def check(self, req: Req) -> None:
        """Set ``req.finish_reason`` if the token just appended ends the request."""
        sp = req.sampling
        tok = req.output_ids[-1]
        if sp.stop_token_ids and tok in sp.stop_token_ids:
            req.finish_reason = FinishReason.stop(tok)
            return
        if not sp.ignore_eos and tok in self.eos_ids and len(req.output_ids) > sp.min_new_tokens:
            req.finish_reason = FinishReason.stop(tok)
            return
        stops, patterns = sp.stop_strs, sp.stop_regex_strs
        if (stops or patterns) and self.tokenizer is not None:
            window = max([len(s) + 2 for s in stops] + [regex_max_len(p) + 2 for p in patterns])
            tail = self.tokenizer.decode(req.output_ids[-window:], skip_special_tokens=sp.skip_special_tokens)
            for s in stops:
                if s in tail:
                    req.finish_reason = FinishReason.stop(s)
                    return
            for p in patterns:
                try:
                    hit = search_stop_regex(p, tail)
                except TimeoutError:
                    req.finish_reason = FinishReason.abort(f"stop_regex: matching {p!r} took over "
                                                           f"{STOP_REGEX_TIMEOUT_S} s (catastrophic backtracking)")
                    return
                if hit:
                    req.finish_reason = FinishReason.stop(p)
                    return
        if len(req.output_ids) >= sp.max_new_tokens:
            req.finish_reason = FinishReason.length(len(req.output_ids))
