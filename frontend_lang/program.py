"""``@function`` programs: ``run``, ``run_batch`` and ``bind``.

    @function
    def qa(s, question):
        s += user(question)
        s += assistant(gen("answer", max_tokens=64))

    state = qa.run(question="Why?", temperature=0, backend=RuntimeEndpoint(url))
    state["answer"]

Keyword arguments of ``run``/``run_batch`` named like a sampling field (max_new_tokens,
temperature, top_p, top_k, min_p, stop, ..., see sampling.py) are defaults for every gen of
the program, unless the function itself has a parameter of that name; so is ``lora`` (or
``lora_path``), the served LoRA adapter every gen and select of the run uses (radixserve's
extension; a gen's or select's own ``lora`` wins).  Errors raised by
the program's own code propagate out of ``run``; a failed gen/select does not: ``run``
returns the state, ``state.error()`` is set and reading the variable raises.
"""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Iterator, Optional, Union

from frontend_lang.api import get_default_backend
from frontend_lang.backend.base import Backend
from frontend_lang.batch import run_batch, run_program
from frontend_lang.errors import ProgramError
from frontend_lang.sampling import SAMPLING_FIELDS, SamplingOverrides
from frontend_lang.state import ProgramState


def resolve_backend(backend: Optional[Backend]) -> Backend:
    """``backend``, else the default one; a handle with an ``endpoint`` (SGLang's ``Runtime``
    convention) stands for that endpoint."""
    backend = backend or get_default_backend()
    backend = getattr(backend, "endpoint", backend)
    if backend is None:
        raise ProgramError("no backend: pass backend=... or call set_default_backend() first")
    return backend


class SglFunction:
    def __init__(self, func: Callable[..., Any], bound: Optional[dict[str, Any]] = None) -> None:
        self.func = func
        self.bound = dict(bound or {})
        params = list(inspect.signature(func).parameters.values())
        if not params:
            raise ProgramError(f"{func.__name__}: a program's first argument is the state (s)")
        self.arg_names = [p.name for p in params[1:]]
        functools.update_wrapper(self, func)

    def split_kwargs(self, kwargs: dict[str, Any]) -> tuple[dict[str, Any], SamplingOverrides]:
        """(arguments of the function, sampling defaults) from run()'s keyword arguments."""
        args, sampling = {}, {}
        for k, v in kwargs.items():
            (sampling if k in SAMPLING_FIELDS and k not in self.arg_names else args)[k] = v
        return {**self.bound, **args}, SamplingOverrides.of(**sampling)

    def bind(self, **kwargs: Any) -> "SglFunction":
        """A copy of this program with some arguments fixed."""
        return SglFunction(self.func, {**self.bound, **kwargs})

    def run(self, *args: Any, stream: bool = False, backend: Optional[Backend] = None, use_thread: bool = True,
            **kwargs: Any) -> ProgramState:
        """Run once; returns the state (after every op ran, or at once with ``stream=True``:
        then read it with ``state.text_iter(...)``).  ``use_thread`` is SGLang's and ignored
        (ops always run on the state's worker thread)."""
        fn_kwargs, defaults = self.split_kwargs(kwargs)
        return run_program(self.func, resolve_backend(backend), args, fn_kwargs, defaults, stream)

    def run_batch(self, batch_kwargs: list[dict[str, Any]], *, num_threads: Union[str, int] = "auto",
                  progress_bar: bool = False, generator_style: bool = False, backend: Optional[Backend] = None,
                  precache: bool = True, **sampling: Any) -> Union[list[ProgramState], Iterator[ProgramState]]:
        """Run the program once per dict of arguments, concurrently (see batch.py); with
        ``generator_style`` an iterator yielding the states in order as they complete."""
        runs = [self.split_kwargs({**sampling, **kw}) for kw in batch_kwargs]
        return run_batch(self.func, runs, num_threads=num_threads, progress_bar=progress_bar,
                         backend=resolve_backend(backend), precache=precache, generator_style=generator_style)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Inside another program, ``other(s, ...)`` runs this body on state ``s``; otherwise
        the same as ``run(...)``."""
        if args and isinstance(args[0], ProgramState):
            return self.func(args[0], *args[1:], **{**self.bound, **kwargs})
        return self.run(*args, **kwargs)


def function(func: Optional[Callable[..., Any]] = None, num_api_spec_tokens: Optional[int] = None) -> Any:
    """Decorator turning ``def prog(s, ...)`` into an ``SglFunction``; ``@function`` or
    ``@function(num_api_spec_tokens=...)``.  SGLang's ``num_api_spec_tokens`` only matters for
    API-model backends (OpenAI & co.) that cannot extend a prefix; it is accepted and
    ignored, since radixserve's backends generate each gen where the text ends."""
    if func is None:
        return lambda f: SglFunction(f)
    return SglFunction(func)
