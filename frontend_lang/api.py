"""The user-facing constructors: ``gen``, ``select``, roles and the default backend.

``gen(name, ...)`` takes SGLang's arguments (``max_tokens`` is max_new_tokens); with
``choices`` it is a ``select`` (as in SGLang).  ``system/user/assistant(expr)`` wrap an
expression in a chat message; with no argument they are an empty message (use
``with s.user():`` or ``user_begin()``/``user_end()`` to write a message piece by piece).
"""
from __future__ import annotations

from typing import Any, Optional, Union

from frontend_lang.backend.base import Backend
from frontend_lang.choice_scoring import ChoicesSamplingMethod, resolve
from frontend_lang.ir import Expr, ExprLike, ExprList, Gen, RoleBegin, RoleEnd, Select, to_expr
from frontend_lang.sampling import SamplingOverrides

_default_backend: Optional[Backend] = None


def set_default_backend(backend: Optional[Backend]) -> None:
    """The backend ``run``/``run_batch`` use when not given ``backend=``."""
    global _default_backend
    _default_backend = backend


def get_default_backend() -> Optional[Backend]:
    return _default_backend


def gen(name: Optional[str] = None, max_tokens: Optional[int] = None, *, min_tokens: Optional[int] = None,
        stop: Union[str, list[str], None] = None, stop_token_ids: Optional[list[int]] = None,
        temperature: Optional[float] = None, top_p: Optional[float] = None, top_k: Optional[int] = None,
        min_p: Optional[float] = None, frequency_penalty: Optional[float] = None,
        presence_penalty: Optional[float] = None, repetition_penalty: Optional[float] = None,
        ignore_eos: Optional[bool] = None, seed: Optional[int] = None, regex: Optional[str] = None,
        json_schema: Union[str, dict, None] = None, choices: Optional[list[str]] = None,
        choices_method: Union[str, ChoicesSamplingMethod, None] = None, return_logprob: Optional[bool] = None,
        logprob_start_len: Optional[int] = None, top_logprobs_num: Optional[int] = None,
        return_text_in_logprobs: Optional[bool] = None, max_new_tokens: Optional[int] = None) -> Expr:
    """Generate text into variable ``name``; unset arguments fall back to the run's defaults."""
    if choices is not None:
        return select(name, choices, choices_method=choices_method)
    sampling = SamplingOverrides.of(
        max_new_tokens=max_tokens if max_tokens is not None else max_new_tokens, min_new_tokens=min_tokens,
        stop=stop, stop_token_ids=stop_token_ids, temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
        frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
        repetition_penalty=repetition_penalty, ignore_eos=ignore_eos, seed=seed, regex=regex,
        json_schema=json_schema, return_logprob=return_logprob, logprob_start_len=logprob_start_len,
        top_logprobs_num=top_logprobs_num, return_text_in_logprobs=return_text_in_logprobs)
    return Gen(name, sampling)


def select(name: Optional[str] = None, choices: Optional[list[str]] = None, temperature: Any = None,
           choices_method: Union[str, ChoicesSamplingMethod, None] = None) -> Expr:
    """Append the most likely of ``choices`` and store it in ``name``.  ``choices_method`` is
    token_length_normalized (default), greedy_token_selection or
    unconditional_likelihood_normalized (objects or names, see choice_scoring.py).
    ``temperature`` is accepted for SGLang compatibility and ignored (scoring is exact)."""
    if not choices or not all(isinstance(c, str) and c for c in choices):
        raise ValueError("select: choices must be a non-empty list of non-empty strings")
    return Select(name, list(choices), resolve(choices_method))


def _role(role: str, expr: Optional[ExprLike]) -> Expr:
    items: list[Expr] = [RoleBegin(role)]
    if expr is not None:
        items.append(to_expr(expr))
    items.append(RoleEnd(role))
    return ExprList(items)


def system(expr: Optional[ExprLike] = None) -> Expr:
    return _role("system", expr)


def user(expr: Optional[ExprLike] = None) -> Expr:
    return _role("user", expr)


def assistant(expr: Optional[ExprLike] = None) -> Expr:
    return _role("assistant", expr)


def system_begin() -> Expr:
    return RoleBegin("system")


def system_end() -> Expr:
    return RoleEnd("system")


def user_begin() -> Expr:
    return RoleBegin("user")


def user_end() -> Expr:
    return RoleEnd("user")


def assistant_begin() -> Expr:
    return RoleBegin("assistant")


def assistant_end() -> Expr:
    return RoleEnd("assistant")
