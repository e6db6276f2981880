"""How ``select`` picks a choice from the per-token logprobs of each choice.

A method is called with each choice's token logprobs given the prefix (``conditional``)
and, when its ``needs_unconditional`` is true, given no prefix (``unconditional``); it
returns (index of the decision, score of every choice).  Ties go to the earlier choice.

- ``token_length_normalized`` (default): the mean token logprob.
- ``greedy_token_selection``: compare choices token by token, keeping those with the best
  logprob at each position; a choice out of tokens counts its own mean from then on.
- ``unconditional_likelihood_normalized``: mean conditional minus mean unconditional
  logprob (favours choices the prefix makes more likely than they are on their own).
"""
from __future__ import annotations

from typing import Optional


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def _argmax(scores: list[float]) -> int:
    return max(range(len(scores)), key=lambda i: (scores[i], -i))


class ChoicesSamplingMethod:
    name = "base"
    needs_unconditional = False

    def __call__(self, conditional: list[list[float]],
                 unconditional: Optional[list[list[float]]] = None) -> tuple[int, list[float]]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return self.name


class TokenLengthNormalized(ChoicesSamplingMethod):
    name = "token_length_normalized"

    def __call__(self, conditional, unconditional=None):
        scores = [mean(lps) for lps in conditional]
        return _argmax(scores), scores


class GreedyTokenSelection(ChoicesSamplingMethod):
    name = "greedy_token_selection"

    def __call__(self, conditional, unconditional=None):
        width = max(len(lps) for lps in conditional)
        padded = [lps + [mean(lps)] * (width - len(lps)) for lps in conditional]
        alive = list(range(len(conditional)))
        for pos in range(width):
            best = max(padded[i][pos] for i in alive)
            alive = [i for i in alive if padded[i][pos] == best]
            if len(alive) == 1:
                break
        scores = [mean(lps) for lps in conditional]
        return alive[0], scores


class UnconditionalLikelihoodNormalized(ChoicesSamplingMethod):
    name = "unconditional_likelihood_normalized"
    needs_unconditional = True

    def __call__(self, conditional, unconditional=None):
        if unconditional is None:
            raise ValueError("unconditional_likelihood_normalized needs the unconditional logprobs")
        scores = [mean(c) - mean(u) for c, u in zip(conditional, unconditional)]
        return _argmax(scores), scores


token_length_normalized = TokenLengthNormalized()
greedy_token_selection = GreedyTokenSelection()
unconditional_likelihood_normalized = UnconditionalLikelihoodNormalized()

METHODS = {m.name: m for m in (token_length_normalized, greedy_token_selection, unconditional_likelihood_normalized)}


def resolve(method: "str | ChoicesSamplingMethod | None") -> ChoicesSamplingMethod:
    """A method object from an object, its name, or None (the default)."""
    if method is None:
        return token_length_normalized
    if isinstance(method, str):
        if method not in METHODS:
            raise ValueError(f"choices_method: unknown method {method!r} (known: {', '.join(METHODS)})")
        return METHODS[method]
    return method
