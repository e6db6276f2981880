"""The user-facing constructors: ``gen``, ``select``, ``document``, roles and the default backend.

``gen(name, ...)`` takes SGLang's arguments (``max_tokens`` is max_new_tokens); with
``choices`` it is a ``select`` (as in SGLang).  ``document(text)`` (radixserve's) appends text
as a document, which the runtime may reuse out of order.  ``system/user/assistant(expr)`` wrap an
expression in a chat message; with no argument they are an empty message (use
``with s.user():`` or ``user_begin()``/``user_end()`` to write a message piece by piece).
"""
from __future__ import annotations

import functools
from typing import Any, Optional, Union

from frontend_lang.backend.base import Backend
from frontend_lang.choice_scoring import ChoicesSamplingMethod, resolve
from frontend_lang.dtypes import DType, check_dtype
from frontend_lang.errors import ProgramError
from frontend_lang.ir import (Document, Expr, ExprLike, ExprList, Gen, RoleBegin, RoleEnd, Select, SeparateReasoning,
                              flatten, to_expr)
from frontend_lang.sampling import SAMPLING_FIELDS, SamplingOverrides
from frontend_lang.tools import make_plan
from radixserve.reasoning.formats import reasoning_format


class GlobalConfig:
    """SGLang's ``global_config``: ``default_backend`` is what ``set_default_backend`` set."""

    def __init__(self) -> None:
        self.default_backend: Optional[Backend] = None


global_config = GlobalConfig()


def set_default_backend(backend: Optional[Backend]) -> None:
    """The backend ``run``/``run_batch`` use when not given ``backend=``."""
    global_config.default_backend = backend


def get_default_backend() -> Optional[Backend]:
    return global_config.default_backend


def gen(name: Optional[str] = None, max_tokens: Optional[int] = None, min_tokens: Optional[int] = None,
        n: Optional[int] = None, stop: Union[str, list[str], None] = None, stop_token_ids: Optional[list[int]] = None,
        stop_regex: Union[str, list[str], None] = None, temperature: Optional[float] = None,
        top_p: Optional[float] = None, top_k: Optional[int] = None, min_p: Optional[float] = None,
        frequency_penalty: Optional[float] = None, presence_penalty: Optional[float] = None,
        ignore_eos: Optional[bool] = None, return_logprob: Optional[bool] = None,
        logprob_start_len: Optional[int] = None, top_logprobs_num: Optional[int] = None,
        return_text_in_logprobs: Optional[bool] = None, dtype: DType = None, choices: Optional[list[str]] = None,
        choices_method: Union[str, ChoicesSamplingMethod, None] = None, regex: Optional[str] = None,
        json_schema: Union[str, dict, None] = None, tools: Optional[list[dict]] = None, tool_choice: Any = None,
        parallel_tool_calls: Optional[bool] = None, lora: Optional[str] = None, **sampling: Any) -> Expr:
    """Generate text into variable ``name``, with SGLang's arguments in SGLang's order; any
    other ``SamplingParams`` field (seed, repetition_penalty, no_stop_trim, ...) by keyword.
    Unset arguments fall back to the run's defaults.  ``lora`` (radixserve's extension; also
    ``lora_path=``) names the served LoRA adapter to generate with.  With ``choices`` it is a ``select``;
    ``dtype`` (int, float, str, bool) constrains the output as dtypes.py says.  ``tools`` /
    ``tool_choice`` / ``parallel_tool_calls`` (OpenAI's) make the calls in the output
    available as ``state.tool_calls(name)`` (see tools.py)."""
    if choices:
        if tools is not None:
            raise ValueError("gen: choices cannot be combined with tools")
        return select(name, choices, temperature, choices_method, sampling.get("priority"),
                      lora or sampling.get("lora_path"))
    if n not in (None, 1):
        raise ValueError("gen: n > 1 is not supported inside a program (use s.fork(n))")
    plan = make_plan(tools, tool_choice, parallel_tool_calls)
    if plan is not None and dtype is not None:
        raise ValueError("gen: dtype cannot be combined with tools")
    given = {k: v for k, v in locals().items() if k in SAMPLING_FIELDS and k != "choices"}
    sampling.setdefault("max_new_tokens", max_tokens)
    sampling.setdefault("min_new_tokens", min_tokens)
    overrides = SamplingOverrides.of(**given, **sampling)
    return Gen(name, overrides, check_dtype(dtype), plan, parallel_tool_calls)


def gen_int(name: Optional[str] = None, max_tokens: Optional[int] = None, n: Optional[int] = None,
            stop: Union[str, list[str], None] = None, stop_token_ids: Optional[list[int]] = None,
            stop_regex: Union[str, list[str], None] = None, **sampling: Any) -> Expr:
    """``gen(..., dtype=int)``."""
    return gen(name, max_tokens, None, n, stop, stop_token_ids, stop_regex, dtype=int, **sampling)


def gen_string(name: Optional[str] = None, max_tokens: Optional[int] = None, n: Optional[int] = None,
               stop: Union[str, list[str], None] = None, stop_token_ids: Optional[list[int]] = None,
               stop_regex: Union[str, list[str], None] = None, **sampling: Any) -> Expr:
    """``gen(..., dtype=str)``: a double-quoted string."""
    return gen(name, max_tokens, None, n, stop, stop_token_ids, stop_regex, dtype=str, **sampling)


def select(name: Optional[str] = None, choices: Optional[list[str]] = None, temperature: Optional[float] = 0.0,
           choices_method: Union[str, ChoicesSamplingMethod, None] = None, priority: Optional[int] = None,
           lora: Optional[str] = None) -> Expr:
    """Append the most likely of ``choices`` and store it in ``name``.  ``choices_method`` is
    token_length_normalized (default), greedy_token_selection or
    unconditional_likelihood_normalized (objects or names, see choice_scoring.py).
    The choice is scored exactly, so ``temperature`` must be 0 (or None), as SGLang's
    /generate backend requires.  ``priority`` and ``lora`` (the LoRA adapter; default: the run's)
    go with every request the scoring sends."""
    if not choices or not all(isinstance(c, str) and c for c in choices):
        raise ValueError("select: choices must be a non-empty list of non-empty strings")
    if temperature is not None and temperature > 1e-5:
        raise ValueError(f"select: temperature must be 0, choices are scored exactly (got {temperature})")
    if lora is not None and not (isinstance(lora, str) and lora):
        raise ValueError("select: lora must be a LoRA adapter's name")
    return Select(name, list(choices), resolve(choices_method), priority, lora)


def document(text: str) -> Expr:
    """Append ``text`` to the prompt as a document (radixserve's extension): the runtime may reuse
    its KV wherever the document is placed, e.g. retrieved passages in any order; a gen whose
    prompt holds documents is sent as /generate ``segments`` (text otherwise), its meta_info
    counting ``document_reused_tokens`` and ``document_recomputed_tokens``.  Set the share
    recomputed with ``gen(..., document_recompute=...)`` or the run's defaults."""
    if not isinstance(text, str):
        raise TypeError(f"document: text must be a str (got {type(text).__name__})")
    return Document(text)


def image(expr: Any) -> Expr:
    """SGLang's image input: not available, radixserve serves text-only models."""
    raise ProgramError("image: radixserve serves text-only models; a program cannot add an image")


def video(path: str, num_frames: int) -> Expr:
    """SGLang's video input: not available, radixserve serves text-only models."""
    raise ProgramError("video: radixserve serves text-only models; a program cannot add a video")


def separate_reasoning(expr: Optional[ExprLike] = None, model_type: Optional[str] = None) -> Expr:
    """SGLang's reasoning split: ``s += separate_reasoning(gen("x"), model_type="qwen3")`` runs the gen,
    then leaves its answer in ``s["x"]`` and its thinking in ``s["x_reasoning_content"]`` ("" when
    it did not think), as ``model_type``'s parser reads it (SGLang's names: qwen3, qwen3-thinking,
    deepseek-r1, deepseek-v3; radixserve/reasoning/).  Every named gen or select of ``expr`` is
    split; the state's text keeps the whole output.  No ``expr``: nothing."""
    if expr is None:
        return ExprList([])
    if model_type is None:
        raise ProgramError("separate_reasoning: model_type is required (e.g. model_type=\"qwen3\")")
    try:
        reasoning_format(model_type)
    except ValueError as e:
        raise ProgramError(f"separate_reasoning: {e}") from None
    e = to_expr(expr)
    named = [op.name for op in flatten(e) if isinstance(op, (Gen, Select)) and op.name]
    return ExprList([e, *(SeparateReasoning(name, model_type) for name in named)])


def flush_cache(backend: Optional[Backend] = None) -> bool:
    """Empty the backend's prefix cache (the default backend's when none is given)."""
    backend = backend or global_config.default_backend
    return False if backend is None else backend.flush_cache()


def get_server_info(backend: Optional[Backend] = None) -> Optional[dict[str, Any]]:
    backend = backend or global_config.default_backend
    return None if backend is None else backend.get_server_info()


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


# ``user_begin()`` ... ``assistant_end()``: one role marker each.
system_begin, user_begin, assistant_begin = (functools.partial(RoleBegin, r) for r in ("system", "user", "assistant"))
system_end, user_end, assistant_end = (functools.partial(RoleEnd, r) for r in ("system", "user", "assistant"))
