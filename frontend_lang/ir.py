"""The program's expressions: what ``s += ...`` accepts.

Strings, ``gen``/``select`` calls, ``document`` texts and role markers are ``Expr`` objects; ``+`` between them
(or with a str) builds an ``ExprList``.  The executor flattens an expression into its leaf
ops (``flatten``) and runs them in order.  The user-facing constructors (``gen``, ``select``,
``system``, ...) live in ``frontend_lang/api.py``; ``REGEX_INT`` & co. (SGLang's names) in dtypes.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Union

from frontend_lang.dtypes import REGEX_BOOL, REGEX_FLOAT, REGEX_INT, REGEX_STR  # noqa: F401 (SGLang's ir names)
from frontend_lang.sampling import SamplingOverrides


class Expr:
    """Base class of all expressions; supports ``a + b`` concatenation."""

    def __add__(self, other: Any) -> "ExprList":
        return ExprList([self, to_expr(other)])

    def __radd__(self, other: Any) -> "ExprList":
        return ExprList([to_expr(other), self])


@dataclass
class Text(Expr):
    text: str


@dataclass
class Document(Expr):
    """Text appended as a document: the runtime may reuse its KV wherever it is placed (sent
    as a ``segments`` entry with ``"document": true``; radixserve's issue 46)."""

    text: str


@dataclass
class Gen(Expr):
    """Generate text from the state's current text; stored under ``name`` (if given)."""

    name: Optional[str]
    sampling: SamplingOverrides = field(default_factory=SamplingOverrides)
    dtype: Optional[str] = None  # "int", "float", "str" or "bool" (see dtypes.py)
    tools: Any = None  # a ToolPlan (frontend_lang/tools.py): parse tool calls from the output
    parallel_tool_calls: Optional[bool] = None


@dataclass
class Select(Expr):
    """Append the most likely of ``choices`` (scored by ``method``, see choice_scoring.py)."""

    name: Optional[str]
    choices: list[str]
    method: Any = None  # a ChoicesSamplingMethod; None means token_length_normalized
    priority: Optional[int] = None  # None: the run's default priority, if any
    lora: Optional[str] = None  # the LoRA adapter's name; None: the run's default, if any


@dataclass
class RoleBegin(Expr):
    role: str


@dataclass
class RoleEnd(Expr):
    role: str


@dataclass
class VarScopeBegin(Expr):
    """Start of ``with s.var_scope(name):``; the text written until ``VarScopeEnd`` becomes ``name``."""

    name: str


@dataclass
class VarScopeEnd(Expr):
    name: str


@dataclass
class SeparateReasoning(Expr):
    """SGLang's reasoning split of variable ``name`` (a gen's or select's, already run): ``name``
    becomes the answer and ``name + "_reasoning_content"`` the thinking (``reasoning_name``), as
    ``model_type``'s parser (radixserve/reasoning/formats.py) reads the text."""

    name: str
    model_type: str

    @property
    def reasoning_name(self) -> str:
        return reasoning_var(self.name)


def reasoning_var(name: str) -> str:
    """The variable holding the thinking of variable ``name`` (SGLang's naming)."""
    return f"{name}_reasoning_content"


@dataclass
class CommitPrefix(Expr):
    """Send the current text to the backend once (max_new_tokens 0) so it is cached."""


@dataclass
class ExprList(Expr):
    items: list[Expr]

    def __add__(self, other: Any) -> "ExprList":
        return ExprList([*self.items, to_expr(other)])


ExprLike = Union[Expr, str, list, tuple]


def to_expr(x: Any) -> Expr:
    """An Expr from an Expr, a str, or a list/tuple of those; TypeError otherwise."""
    if isinstance(x, Expr):
        return x
    if isinstance(x, str):
        return Text(x)
    if isinstance(x, (list, tuple)):
        return ExprList([to_expr(i) for i in x])
    raise TypeError(f"cannot add a {type(x).__name__} to a program state; use a str, gen(), select() or a role")


def flatten(x: ExprLike) -> list[Expr]:
    """The leaf ops of an expression in execution order (roles become begin/end pairs)."""
    e = to_expr(x)
    if isinstance(e, ExprList):
        return [leaf for item in e.items for leaf in flatten(item)]
    return [e]


def produces(op: Expr) -> tuple[str, ...]:
    """The variables an op sets."""
    if isinstance(op, SeparateReasoning):
        return op.name, op.reasoning_name
    return (op.name,) if isinstance(op, (Gen, Select, VarScopeEnd)) and op.name is not None else ()
