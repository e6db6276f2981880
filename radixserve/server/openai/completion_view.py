"""How a /v1/completions choice renders: its ``text`` and its ``logprobs`` (OpenAI's legacy API).

With ``echo`` a choice's text is its prompt followed by the completion (each of the ``n``
choices of a prompt echoes that prompt; a streamed choice carries the prompt in its first
chunk).  A prompt given as text is echoed as given, token ids are decoded.  With
``logprobs=k`` and ``echo`` the ``tokens``, ``token_logprobs``, ``top_logprobs`` and
``text_offset`` cover the prompt tokens first (the first prompt token has no logprob: null,
as OpenAI returns it), then the completion's; ``text_offset`` indexes the choice's ``text``
(a token's offset is where the previous tokens' strings end; the completion's start at
the end of the echoed prompt).  ``top_logprobs`` is null when k == 0.
"""
from __future__ import annotations

from typing import Any, Optional

from radixserve.ipc.worker_link import TokenLogprob
from radixserve.server.req_state import ReqState


class CompletionView:
    def __init__(self, tm: Any, prompt_texts: Optional[list[str]], n: int) -> None:
        """``prompt_texts``: one per prompt when echoing, else None."""
        self.tm = tm
        self.prompt_texts = prompt_texts
        self.n = n

    @property
    def echo(self) -> bool:
        return self.prompt_texts is not None

    def prefix(self, st: ReqState) -> str:
        return self.prompt_texts[st.index // self.n] if self.prompt_texts is not None else ""

    def text(self, st: ReqState, delta: str, first: bool) -> str:
        """A chunk's text: ``delta`` of the completion, after the prompt in a choice's first chunk."""
        return self.prefix(st) + delta if first else delta

    def logprobs(self, st: ReqState, start: int, top: int, first: bool) -> dict[str, Any]:
        """The ``logprobs`` object of output tokens ``start:`` (and of the prompt in the first chunk)."""
        token_text = self.tm.token_text
        entries: list[tuple[str, Optional[TokenLogprob]]] = []
        offsets: list[int] = []
        if first and self.echo:
            entries = [(token_text(tid), lp) for tid, lp in zip(st.input_ids, st.input_logprobs)]
            pos = 0
            for s, _ in entries:
                offsets.append(pos)
                pos += len(s)
        pos = len(self.prefix(st)) + sum(len(token_text(t.token_id)) for t in st.output_logprobs[:start])
        for t in st.output_logprobs[start:]:
            s = token_text(t.token_id)
            entries.append((s, t))
            offsets.append(pos)
            pos += len(s)
        tops = None
        if top:
            tops = [None if t is None else {token_text(i): v for v, i in (t.top or [])[:top]} for _, t in entries]
        return {"tokens": [s for s, _ in entries], "token_logprobs": [None if t is None else t.logprob for _, t in entries],
                "text_offset": offsets, "top_logprobs": tops}


def prompt_texts(tm: Any, prompt: Any, ids: list[list[int]]) -> list[str]:
    """The text each prompt echoes: a string as given, token ids decoded."""
    if isinstance(prompt, str):
        return [prompt]
    if prompt and all(isinstance(x, str) for x in prompt):
        return list(prompt)
    return [tm.tokenizer.decode(i) for i in ids]
