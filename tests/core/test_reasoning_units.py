"""Reasoning models without a model: the split of an output into reasoning and answer (whole,
and streamed over every way of cutting the text into deltas, ``</think>`` included), the formats'
thinking switches and token check, the deferred grammar (``ReasonerState``) over a small fake
grammar, and the front door's checks of ``require_reasoning`` / ``thinking_token_budget``."""
from __future__ import annotations

import itertools
import numpy as np
import pytest

from radixserve.constrained.runtime.fsm_state import GrammarState
from radixserve.constrained.runtime.reasoner_state import ReasonerState
from radixserve.ipc.worker_link import WorkerInfo
from radixserve.reasoning.formats import FORMATS, reasoning_format, think_token_ids, thinking_enabled
from radixserve.reasoning.split import ReasoningStream, split_reasoning
from radixserve.request_builder import Limits, RequestBuilder

QWEN3, R1, V3 = FORMATS["qwen3"], FORMATS["deepseek-r1"], FORMATS["deepseek-v3"]


@pytest.mark.parametrize("text,thinking,want", [
    ("<think>\nplan</think>\n\n42", True, ("\nplan", "\n\n42")),
    ("plan</think>42", True, ("plan", "42")),  # the template opened the block: no start tag in the output
    ("  <think>plan</think>42", True, ("plan", "42")),
    ("plan, cut by max_tokens", True, ("plan, cut by max_tokens", "")),
    ("</think>42", True, ("", "42")),
    ("a</think>b</think>c", True, ("a", "b</think>c")),  # only the first end tag closes
    ("just an answer", False, (None, "just an answer")),
    ("<think>plan</think>42", False, ("plan", "42")),  # a model that thinks anyway is split
    ("an answer</think>tail", False, (None, "an answer</think>tail")),  # no block was opened
])
def test_split_whole(text, thinking, want):
    assert split_reasoning(text, QWEN3, thinking) == want


def _stream(deltas: list[str], thinking: bool) -> tuple[list[str], list[str]]:
    """The reasoning deltas and the answer's growth of a stream fed ``deltas``."""
    rs, text, thoughts, answers = ReasoningStream(QWEN3, thinking), "", [], []
    for k, d in enumerate(deltas):
        text += d
        thought, answer = rs.step(text, k == len(deltas) - 1)
        thoughts.append(thought)
        answers.append(answer)
    return thoughts, answers


@pytest.mark.parametrize("text,thinking", [
    ("<think>\nx < y</think>\n\n{\"a\": 1}", True),
    ("r</thi</think>ans", True),  # a false start of the end tag inside the reasoning
    ("reasoning cut short </thi", True),
    ("<thin", True),
    ("<think>a</think>b", False),
    ("<thinking is not a tag>", False),
    ("plain </think> answer", False),
])
def test_split_streamed_equals_whole_for_every_two_cuts(text, thinking):
    """Every way of cutting the text into up to three deltas (so a tag arrives split across deltas at
    every position): the reasoning deltas add up to the whole split's reasoning, the answer only grows
    and ends as the whole split's answer, and no reasoning delta or answer ever shows a piece of a tag
    that the whole split does not keep."""
    reasoning, answer = split_reasoning(text, QWEN3, thinking)
    for i, j in itertools.combinations_with_replacement(range(len(text) + 1), 2):
        deltas = [text[:i], text[i:j], text[j:]]
        thoughts, answers = _stream(deltas, thinking)
        assert "".join(thoughts) == (reasoning or ""), (deltas, thoughts)
        assert answers[-1] == answer, (deltas, answers)
        for a, b in zip(answers, answers[1:]):
            assert b.startswith(a), (deltas, answers)


def test_split_streamed_on_token_boundaries_of_a_tokenizer_without_the_tags(smol_dir):
    """SmolLM2's tokenizer has no think tokens: ``</think>`` arrives as several tokens, one per delta."""
    from radixserve.tokenizer import load_light_tokenizer

    tok = load_light_tokenizer(smol_dir)
    text = "<think>\nLet me see: 6 * 7.\n</think>\n\n{\"answer\": 42}"
    ids = tok.encode(text, add_special_tokens=False)
    pieces = [tok.decode(ids[:k]) for k in range(len(ids) + 1)]
    assert any("</" in pieces[k + 1][len(pieces[k]):] and "</think>" not in pieces[k + 1] for k in range(len(ids)))
    deltas = [b[len(a):] for a, b in zip(pieces, pieces[1:])]
    thoughts, answers = _stream(deltas, True)
    assert "".join(thoughts) == "\nLet me see: 6 * 7.\n" and answers[-1] == "\n\n{\"answer\": 42}"
    assert not any("<" in t for t in thoughts)  # never a piece of </think> in the reasoning


def test_thinking_switches():
    assert thinking_enabled(QWEN3, None) and thinking_enabled(QWEN3, {"enable_thinking": True})
    assert not thinking_enabled(QWEN3, {"enable_thinking": False})
    assert not thinking_enabled(V3, None) and thinking_enabled(V3, {"thinking": True})
    assert thinking_enabled(R1, {"enable_thinking": False})  # R1 always thinks
    assert reasoning_format("DeepSeek-R1") is R1
    with pytest.raises(ValueError, match="unknown reasoning parser 'nope'.*qwen3"):
        reasoning_format("nope")


class _Tok:
    def __init__(self, vocab: dict[str, list[int]], special: tuple[str, ...] = ()) -> None:
        self.vocab, self.special = vocab, special

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.vocab[text]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        text = next(t for t, i in self.vocab.items() if i == ids)
        return "" if skip_special_tokens and text in self.special else text


def test_think_token_ids_one_line_errors(smol_dir):
    from radixserve.tokenizer import load_light_tokenizer

    with pytest.raises(ValueError, match=r"^reasoning_parser 'qwen3': the tokenizer has no <think> token"):
        think_token_ids(QWEN3, load_light_tokenizer(smol_dir))
    assert think_token_ids(QWEN3, _Tok({"<think>": [7], "</think>": [8]})) == (7, 8)
    with pytest.raises(ValueError, match="special token that decoding drops"):
        think_token_ids(R1, _Tok({"<think>": [7], "</think>": [8]}, special=("</think>",)))


# ------------------------------------------------------------------ the deferred grammar
V, END, EOS = 16, 9, 15
DIGITS = np.zeros(V, dtype=bool)
DIGITS[:3] = True  # the fake grammar: two tokens of {0, 1, 2}, then EOS


class _TwoDigits(GrammarState):
    """A fake compiled grammar: exactly two tokens in {0, 1, 2}; forces token 2 after a 0."""

    def __init__(self) -> None:
        self.seen: list[int] = []
        self.vocab = None  # read only by the "close" budget's steering, which these tests do not use

    def _mask(self, seen: list[int]) -> np.ndarray:
        if len(seen) >= 2:
            m = np.zeros(V, dtype=bool)
            m[EOS] = True
            return m
        if seen == [0]:
            m = np.zeros(V, dtype=bool)
            m[2] = True
            return m
        return DIGITS.copy()

    def mask(self, ignore_eos: bool = False) -> np.ndarray:
        return self._mask(self.seen)

    def is_accepting(self) -> bool:
        return len(self.seen) == 2

    def has_token(self) -> bool:
        return len(self.seen) < 2

    def accept(self, token: int) -> bool:
        if not self._mask(self.seen)[token] or token == EOS:
            return False
        self.seen.append(token)
        return True

    def splice(self, tokens: list[int]) -> None:
        self.seen[-1:] = tokens

    def forced(self) -> bytes:
        return b"2" if self.seen == [0] else b""

    @property
    def has_prev(self) -> bool:
        return bool(self.seen)

    def valid_from_prev(self, tokens: list[int]) -> bool:
        return True

    def mask_from_prev(self, tokens: list[int]) -> np.ndarray:
        return self._mask(self.seen[:-1] + tokens)

    def masks_along(self, tokens: list[int], ignore_eos: bool = False) -> tuple[list[int], np.ndarray]:
        kept, seen, rows = [], list(self.seen), [self._mask(self.seen)]
        for t in tokens:
            if not rows[-1][t] or t == EOS:
                break
            kept.append(t)
            seen.append(t)
            rows.append(self._mask(seen))
        return kept, np.stack(rows)


def test_deferred_grammar_masks_nothing_while_thinking_then_starts_fresh():
    gs = ReasonerState(_TwoDigits(), END, V, eos_ids=(EOS,))
    assert gs.mask() is None and gs.answer_start is None and gs.forced() == b"" and not gs.has_prev
    for t in (5, 0, 7):  # thinking: anything goes, even tokens the grammar would refuse; no jump
        assert gs.accept(t) and gs.mask() is None and not gs.has_prev and gs.outcome() is None
    assert not gs.is_accepting()
    assert gs.accept(END) and gs.answer_start == 4  # output: 5 0 7 </think>, the answer from index 4
    assert np.array_equal(gs.mask(), DIGITS) and not gs.has_prev  # the grammar from its start state
    assert not gs.accept(7)  # now constrained
    assert gs.accept(0) and gs.has_prev and gs.forced() == b"2"
    assert gs.accept(2) and gs.is_accepting() and gs.outcome() == "complete"


def test_thinking_budget_forces_the_end_token():
    gs = ReasonerState(_TwoDigits(), END, V, budget=2, eos_ids=(EOS,))
    assert gs.accept(4) and gs.mask() is None and gs.accept(4)
    forced = gs.mask()
    assert forced is not None and forced.sum() == 1 and forced[END]
    assert not gs.accept(4)  # only the end token may follow
    assert gs.accept(END) and np.array_equal(gs.mask(), DIGITS)
    zero = ReasonerState(None, END, V, budget=0)  # a budget without a constraint: the answer is free
    assert zero.mask()[END] and zero.mask().sum() == 1
    assert zero.accept(END) and zero.mask() is None and zero.is_accepting() and zero.outcome() is None


def test_masks_along_cross_the_end_of_thinking():
    gs = ReasonerState(_TwoDigits(), END, V, budget=3, eos_ids=(EOS,))
    kept, masks = gs.masks_along([6, 6, END, 0, 9])  # 9 is refused by the grammar: the proposal is cut
    assert kept == [6, 6, END, 0] and masks.shape == (5, V)
    assert masks[0].all() and masks[1].all() and masks[2].all()  # thinking rows: everything
    assert np.array_equal(masks[3], DIGITS) and masks[4].sum() == 1 and masks[4][2]
    kept, masks = gs.masks_along([6, 6, 6, 6])  # the budget allows three thinking tokens
    assert kept == [6, 6, 6] and masks[3].sum() == 1 and masks[3][END]
    kept, _ = gs.masks_along([6, EOS, 6])
    assert kept == [6]


def test_front_door_checks():
    info = WorkerInfo(num_slots=101, max_rows=8, context_len=64, vocab_size=1000, dtype="float32", device="cpu",
                      hf_dir="")
    plain, thinking = RequestBuilder(Limits.of(info)), RequestBuilder(Limits.of(info), reasoning_parser="qwen3")
    with pytest.raises(ValueError, match="require_reasoning: this server has no reasoning parser"):
        plain.build([[1]], [{"require_reasoning": True}], ["text"])
    with pytest.raises(ValueError, match="thinking_token_budget: applies only to an output that thinks"):
        thinking.build([[1]], [{"thinking_token_budget": 4}], ["text"])
    with pytest.raises(ValueError, match="thinking_token_budget: must be an integer >= 0"):
        thinking.build([[1]], [{"require_reasoning": True, "thinking_token_budget": -1}], ["text"])
    with pytest.raises(ValueError, match="require_reasoning: must be a boolean"):
        thinking.build([[1]], [{"require_reasoning": "yes"}], ["text"])
    (req,) = thinking.build([[1]], [{"require_reasoning": True, "thinking_token_budget": 0}], ["text"])
    assert req.sampling.require_reasoning and req.sampling.thinking_token_budget == 0
