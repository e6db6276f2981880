"""Finish conditions: EOS, stop token ids, max_new_tokens and stop strings.

Stop strings are matched on the decoded tail of the output, so a match that spans a
token boundary is found; the text trim happens where the output text is assembled.
"""
from __future__ import annotations

from typing import Any, Optional

from radixserve.request import FinishReason
from radixserve.scheduler.req import Req


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
        stops = sp.stop_strs
        if stops and self.tokenizer is not None:
            window = max(len(s) for s in stops) + 2
            tail = self.tokenizer.decode(req.output_ids[-window:], skip_special_tokens=sp.skip_special_tokens)
            for s in stops:
                if s in tail:
                    req.finish_reason = FinishReason.stop(s)
                    return
        if len(req.output_ids) >= sp.max_new_tokens:
            req.finish_reason = FinishReason.length(len(req.output_ids))
