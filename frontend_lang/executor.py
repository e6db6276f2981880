"""``StreamExecutor``: runs one program state's ops, in order, on a worker thread.

``submit`` queues ops and returns at once (a worker thread is started while there is
work), so ``s += gen(...)`` does not block; ``get_var`` waits until no queued op still
has to set that variable.  If an op fails, the error is stored, the remaining queued ops
are dropped and later ones ignored, and every waiter wakes up: reading a variable the
failed work should have set raises that error (never a hang).  All shared state is
guarded by one condition variable, which also wakes streaming readers (``stream.py``).
"""
from __future__ import annotations

import threading
from collections import deque
from typing import Any, Optional

from frontend_lang.backend.base import Backend, lora_kw
from frontend_lang.choice_scoring import resolve
from frontend_lang.dtypes import apply_dtype
from frontend_lang.errors import ProgramError
from frontend_lang.ir import (CommitPrefix, Document, Expr, ExprLike, Gen, RoleBegin, RoleEnd, Select,
                              SeparateReasoning, Text, VarScopeBegin, VarScopeEnd, flatten, produces)
from frontend_lang.sampling import SamplingOverrides
from frontend_lang.select_op import run_select
from frontend_lang.tools import parse_calls, sampling_with_tools
from frontend_lang.transcript import Transcript
from radixserve.reasoning.formats import ReasoningFormat, reasoning_format
from radixserve.reasoning.split import split_reasoning


def reasoning_of(model_type: str) -> tuple[ReasoningFormat, bool]:
    """The format ``model_type`` names and whether its text starts thinking (SGLang's parser default)."""
    fmt = reasoning_format(model_type)
    return fmt, fmt.forced


class StreamExecutor:
    def __init__(self, backend: Backend, defaults: Optional[SamplingOverrides] = None, stream: bool = False) -> None:
        self.backend = backend
        self.defaults = defaults or SamplingOverrides()
        self.stream = stream
        self.transcript = Transcript()
        self.variables: dict[str, Any] = {}
        self.meta_info: dict[str, Any] = {}
        self.error: Optional[BaseException] = None
        self.partial: Optional[tuple[Optional[str], str]] = None  # (name, text) of a streaming gen
        self.ended = False  # the program body returned: no more ops will come
        self.children: list["StreamExecutor"] = []
        self.fork_start = 0  # length of the text this executor was forked with (0: not a branch)
        self._scopes: dict[str, int] = {}  # open var_scope name -> where its text starts
        self.cond = threading.Condition()
        self._queue: deque[Expr] = deque()
        self._pending: dict[str, int] = {}  # variable -> queued ops that set it
        self._busy = False

    # ------------------------------------------------------------------ submitting
    def submit(self, expr: ExprLike) -> None:
        """Queue an expression's ops (ignored once an op has failed)."""
        ops = flatten(expr)
        with self.cond:
            if self.error is not None:
                return
            for op in ops:
                for name in produces(op):
                    self._pending[name] = self._pending.get(name, 0) + 1
            self._queue.extend(ops)
            if not self._busy and self._queue:
                self._busy = True
                threading.Thread(target=self._work, name="frontend-executor", daemon=True).start()

    def _work(self) -> None:
        while True:
            with self.cond:
                if not self._queue or self.error is not None:
                    self._queue.clear()
                    self._pending.clear()
                    self._busy = False
                    self.cond.notify_all()
                    return
                op = self._queue.popleft()
            try:
                self._execute(op)
            except BaseException as e:  # noqa: BLE001 - stored and raised to the reader
                with self.cond:
                    self.error = e
                    self.partial = None
            finally:
                with self.cond:
                    for name in produces(op):
                        if self._pending.get(name, 0) > 0:
                            self._pending[name] -= 1
                    self.cond.notify_all()

    # ------------------------------------------------------------------ ops
    def _execute(self, op: Expr) -> None:
        if isinstance(op, Text):
            with self.cond:
                self.transcript.append(op.text)
        elif isinstance(op, Document):
            with self.cond:
                self.transcript.append_document(op.text)
        elif isinstance(op, (RoleBegin, RoleEnd)):
            template = self.backend.chat_template()
            with self.cond:
                if isinstance(op, RoleBegin):
                    self.transcript.role_begin(op.role, template)
                else:
                    self.transcript.role_end(op.role, template)
        elif isinstance(op, Gen):
            self._gen(op)
        elif isinstance(op, Select):
            priority = op.priority if op.priority is not None else self.defaults.priority
            lora = op.lora if op.lora is not None else self.defaults.lora_path
            index, meta = run_select(self.backend, self.text(), op.choices, resolve(op.method), priority, lora)
            self._commit(op.name, op.choices[index], op.choices[index], meta)
        elif isinstance(op, VarScopeBegin):
            with self.cond:
                self._scopes[op.name] = len(self.transcript.text)
        elif isinstance(op, VarScopeEnd):
            with self.cond:
                if op.name not in self._scopes:
                    raise ProgramError(f"var_scope {op.name!r} ended but never begun")
                self.variables[op.name] = self.transcript.text[self._scopes.pop(op.name):]
        elif isinstance(op, SeparateReasoning):
            with self.cond:
                if op.name not in self.variables:
                    raise ProgramError(f"separate_reasoning: variable {op.name!r} was never set")
                reasoning, answer = split_reasoning(str(self.variables[op.name]), *reasoning_of(op.model_type))
                self.variables[op.name] = answer
                self.variables[op.reasoning_name] = reasoning or ""
        elif isinstance(op, CommitPrefix):
            text = self.text()
            if text:  # under the run's adapter: the cache is per adapter
                self.backend.cache_prefix(text=text, **lora_kw(self.defaults.lora_path))
        else:
            raise TypeError(f"unknown op {op!r}")

    def _gen(self, op: Gen) -> None:
        params, options = self.defaults.merged(op.sampling).split()
        params = apply_dtype(params, op.dtype)
        source = self.backend.chat_template().source if op.tools is not None else ""
        if op.tools is not None:
            params = sampling_with_tools(op.tools, params, source, op.parallel_tool_calls)
        on_text = None
        if self.stream:
            def on_text(text: str) -> None:
                with self.cond:
                    self.partial = (op.name, text)
                    self.cond.notify_all()
        with self.cond:
            prompt, docs = self.transcript.text, list(self.transcript.documents)
        extra = {"documents": docs} if docs else {}  # a backend without documents never sees the argument
        text, meta = self.backend.generate(prompt, params, options, on_text, **extra)
        if op.tools is not None:
            meta = {**meta, "tool_calls": parse_calls(op.tools, text, source)}
        self._commit(op.name, text, text, meta)

    def _commit(self, name: Optional[str], text: str, value: Any, meta: Any) -> None:
        with self.cond:
            self.transcript.append(text)
            self.partial = None
            if name is not None:
                self.variables[name] = value
                self.meta_info[name] = meta

    # ------------------------------------------------------------------ reading
    def text(self) -> str:
        with self.cond:
            return self.transcript.text

    def sync(self) -> None:
        """Wait until every queued op has run (or been dropped after an error)."""
        with self.cond:
            self.cond.wait_for(lambda: not self._busy)

    def _wait_var(self, name: str) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self._pending.get(name, 0) == 0 or self.error is not None)
            if self.error is not None and (self._pending.get(name, 0) or name not in self.variables):
                raise self.error
            if name not in self.variables:
                raise KeyError(f"variable {name!r} was never set")

    def get_var(self, name: str) -> Any:
        self._wait_var(name)
        return self.variables[name]

    def get_meta_info(self, name: str) -> Any:
        self._wait_var(name)
        return self.meta_info[name]

    def set_var(self, name: str, value: Any) -> None:
        """Set a variable from the program's own code (after the queued ops that set it ran)."""
        with self.cond:
            self.cond.wait_for(lambda: self._pending.get(name, 0) == 0 or self.error is not None)
            self.variables[name] = value
            self.cond.notify_all()

    def is_pending(self, name: str) -> bool:
        """Whether a queued op still has to set ``name`` (call with ``cond`` held)."""
        return self._pending.get(name, 0) > 0

    @property
    def idle(self) -> bool:
        """No op queued or running (read with ``cond`` held)."""
        return not self._busy

    def end(self) -> None:
        """Mark the program as complete (and its fork branches)."""
        with self.cond:
            self.ended = True
            children = list(self.children)
            self.cond.notify_all()
        for c in children:
            c.end()

    # ------------------------------------------------------------------ fork
    def fork(self, n: int) -> list["StreamExecutor"]:
        """Commit the current text as a prefix hint, wait, and return ``n`` copies of this
        executor (same text, messages, variables) that run independently."""
        self.submit(CommitPrefix())
        self.sync()
        branches = []
        with self.cond:
            for _ in range(n):
                b = StreamExecutor(self.backend, self.defaults, self.stream)
                b.transcript = self.transcript.copy()
                b.variables = dict(self.variables)
                b.meta_info = dict(self.meta_info)
                b.error = self.error
                b.fork_start = len(self.transcript.text)
                branches.append(b)
            self.children.extend(branches)
        return branches
