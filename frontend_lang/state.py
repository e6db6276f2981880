"""``ProgramState`` (the ``s`` of a program) and ``ProgramStateGroup`` (what ``s.fork`` returns).

``s += expr`` queues work and returns at once; ``s["x"]`` waits for ``x`` and raises the
stored error if the op that should have set it failed (SGLang semantics: ``run()`` itself
returns the state; ``state.error()`` tells whether something failed).
"""
from __future__ import annotations

import asyncio
import contextlib
from typing import Any, AsyncIterator, Callable, Iterator, Optional, Union

from frontend_lang.executor import StreamExecutor
from frontend_lang.ir import ExprLike, RoleBegin, RoleEnd, Text, VarScopeBegin, VarScopeEnd, to_expr
from frontend_lang.stream import text_iter

_END = object()


class _RoleScope:
    """``with s.user(): ...`` opens a role on enter and closes it on exit."""

    def __init__(self, state: "ProgramState", role: str) -> None:
        self.state, self.role = state, role

    def __enter__(self) -> "ProgramState":
        self.state._ex.submit(RoleBegin(self.role))
        return self.state

    def __exit__(self, *exc: Any) -> None:
        self.state._ex.submit(RoleEnd(self.role))


class ProgramState:
    def __init__(self, executor: StreamExecutor) -> None:
        self._ex = executor
        self.ret_value: Any = None  # what the program function returned

    # ------------------------------------------------------------------ writing
    def __iadd__(self, other: ExprLike) -> "ProgramState":
        if other is None:
            raise ValueError("Tried to append None to state.")
        self._ex.submit(to_expr(other))
        return self

    @contextlib.contextmanager
    def var_scope(self, name: str) -> Iterator["ProgramState"]:
        """``with s.var_scope("x"): ...``: the text written inside becomes variable ``x``."""
        self._ex.submit(VarScopeBegin(name))
        try:
            yield self
        finally:
            self._ex.submit(VarScopeEnd(name))

    @contextlib.contextmanager
    def copy(self) -> Iterator["ProgramState"]:
        """``with s.copy() as c: ...``: one fork branch, joined (gathering its variables) on exit."""
        group = self.fork(1)
        try:
            yield group[0]
        finally:
            group.join()

    def _role(self, role: str, expr: Optional[ExprLike]) -> Optional[_RoleScope]:
        if expr is None:
            return _RoleScope(self, role)
        self._ex.submit([RoleBegin(role), to_expr(expr), RoleEnd(role)])
        return None

    def system(self, expr: Optional[ExprLike] = None) -> Optional[_RoleScope]:
        """``s.system("...")`` adds a system message; ``with s.system():`` scopes one."""
        return self._role("system", expr)

    def user(self, expr: Optional[ExprLike] = None) -> Optional[_RoleScope]:
        return self._role("user", expr)

    def assistant(self, expr: Optional[ExprLike] = None) -> Optional[_RoleScope]:
        return self._role("assistant", expr)

    def fork(self, size: int = 1) -> "ProgramStateGroup":
        """``size`` branches sharing the current text (sent once as a prefix hint)."""
        return ProgramStateGroup([ProgramState(e) for e in self._ex.fork(size)], self)

    # ------------------------------------------------------------------ reading
    def __getitem__(self, name: str) -> Any:
        return self._ex.get_var(name)

    def get_var(self, name: str) -> Any:
        return self._ex.get_var(name)

    def set_var(self, name: str, value: Any) -> None:
        self._ex.set_var(name, value)

    def __setitem__(self, name: str, value: Any) -> None:
        self._ex.set_var(name, value)

    def get_meta_info(self, name: str) -> Any:
        """The meta_info of the gen/select that set ``name`` (server fields for a gen; the
        decision and every choice's scores for a select)."""
        return self._ex.get_meta_info(name)

    def tool_calls(self, name: str) -> list[dict[str, Any]]:
        """The calls a ``gen(name, tools=...)`` made, as OpenAI's ``message.tool_calls``
        (``[]`` when it made none or had no tools)."""
        meta = self._ex.get_meta_info(name)
        return list(meta.get("tool_calls") or []) if isinstance(meta, dict) else []

    def __contains__(self, name: str) -> bool:
        self._ex.sync()
        return name in self._ex.variables

    def text(self) -> str:
        """The full text once every queued op has run."""
        self._ex.sync()
        return self._ex.text()

    def messages(self) -> list[dict[str, Any]]:
        """The chat messages written so far, as [{"role", "content"}]."""
        self._ex.sync()
        with self._ex.cond:
            return [dict(m) for m in self._ex.transcript.messages]

    def sync(self) -> "ProgramState":
        self._ex.sync()
        return self

    def error(self) -> Optional[BaseException]:
        """The error of the first failed op, or None (waits for queued ops first)."""
        self._ex.sync()
        return self._ex.error

    def text_iter(self, var_name: Optional[str] = None) -> Iterator[str]:
        """Incremental text of ``var_name`` (or of everything) while the program runs."""
        return text_iter(self._ex, var_name)

    async def text_async_iter(self, var_name: Optional[str] = None,
                              return_meta_data: bool = False) -> AsyncIterator[Any]:
        """``text_iter`` for asyncio code (each chunk is awaited on a worker thread); with
        ``return_meta_data`` it yields (chunk, meta_info of ``var_name`` so far)."""
        loop = asyncio.get_running_loop()
        chunks = self.text_iter(var_name)
        while True:
            chunk = await loop.run_in_executor(None, next, chunks, _END)
            if chunk is _END:
                return
            yield (chunk, self._ex.meta_info.get(var_name)) if return_meta_data else chunk

    def __repr__(self) -> str:
        return f"ProgramState({self.text()!r})"


class ProgramStateGroup:
    """The branches of a fork: indexable, iterable, ``forks[i] += ...`` extends one branch,
    ``forks += ...`` every branch (a list or tuple applies item i to branch i, a callable
    ``f`` applies ``f(i)``); ``join()`` gathers the branches' new variables, and
    ``join("concate_and_append")`` appends the branches' new text to the parent in order."""

    def __init__(self, states: list[ProgramState], parent: ProgramState) -> None:
        self.states = states
        self.parent = parent

    def __len__(self) -> int:
        return len(self.states)

    def __getitem__(self, i: int) -> ProgramState:
        return self.states[i]

    def __setitem__(self, i: int, value: ProgramState) -> None:
        """Completes ``forks[i] += expr`` (which extends branch i in place and stores it back)."""
        if value is not self.states[i]:
            raise TypeError("a fork's branches cannot be replaced; extend one with forks[i] += ...")

    def __iter__(self) -> Iterator[ProgramState]:
        return iter(self.states)

    def __iadd__(self, other: Union[ExprLike, list, tuple, Callable[[int], ExprLike]]) -> "ProgramStateGroup":
        if callable(other):
            other = [other(i) for i in range(len(self.states))]
        if isinstance(other, (list, tuple)):
            if len(other) != len(self.states):
                raise ValueError(f"a list added to {len(self.states)} branches needs {len(self.states)} items")
            for s, o in zip(self.states, other):
                s += o
        else:
            for s in self.states:
                s += other
        return self

    def sync(self) -> None:
        for s in self.states:
            s.sync()

    def join(self, mode: str = "gather_variable") -> None:
        """Wait for every branch.  "gather_variable": each variable a branch set that the
        parent did not have before the fork becomes, in the parent, the list of the branches'
        values (same for meta_info).  "concate_and_append": the text each branch wrote since
        the fork is appended to the parent, branch by branch.  Raises the first branch error."""
        if mode == "concate_and_append":
            return self._concat()
        if mode != "gather_variable":
            raise ValueError(f"join: mode must be 'gather_variable' or 'concate_and_append' (got {mode!r})")
        parent = self.parent._ex
        parent.sync()
        known = set(parent.variables)
        gathered: dict[str, list] = {}
        metas: dict[str, list] = {}
        for s in self.states:
            s._ex.sync()
            if s._ex.error is not None:
                raise s._ex.error
            for name, value in s._ex.variables.items():
                if name not in known:
                    gathered.setdefault(name, []).append(value)
                    metas.setdefault(name, []).append(s._ex.meta_info.get(name))
        with parent.cond:
            parent.variables.update(gathered)
            parent.meta_info.update(metas)
            parent.cond.notify_all()

    def _concat(self) -> None:
        texts = []
        for s in self.states:
            s._ex.sync()
            if s._ex.error is not None:
                raise s._ex.error
            texts.append(s._ex.text()[s._ex.fork_start:])
        self.parent._ex.submit(Text("".join(texts)))
        self.parent._ex.sync()
