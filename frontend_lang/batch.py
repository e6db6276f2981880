"""Running programs: ``run_program`` (one run) and ``run_batch`` (many runs of one program on
a thread pool, after a shared-prefix hint).

Before a batch of two or more programs runs, each is dry-run up to its first model call
(tracer.py); the longest text common to all of them, cut back to just before a run of
whitespace (so the cut falls on a token boundary of the full prompts in practice), is
sent once with max_new_tokens 0 (under the runs' LoRA adapter; no hint when they use
different ones).  Every program's first request then hits that cached prefix instead of
all of them prefilling it at the same time.  Program bodies therefore
run their code up to the first gen/select twice (once traced); pass ``precache=False`` if
that matters.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
from concurrent.futures import Future, ThreadPoolExecutor, as_completed, wait
from typing import Any, Callable, Iterator, Optional, Union

from frontend_lang.backend.base import Backend, lora_kw
from frontend_lang.executor import StreamExecutor
from frontend_lang.sampling import SamplingOverrides
from frontend_lang.state import ProgramState
from frontend_lang.tracer import traced_prefix

Run = tuple[dict[str, Any], SamplingOverrides]  # (the function's keyword arguments, sampling defaults)

logger = logging.getLogger(__name__)


def run_program(func: Callable[..., Any], backend: Backend, args: tuple, kwargs: dict[str, Any],
                defaults: SamplingOverrides, stream: bool = False) -> ProgramState:
    """Run the body on a fresh state; wait for all its ops unless ``stream``."""
    ex = StreamExecutor(backend, defaults, stream)
    state = ProgramState(ex)
    try:
        state.ret_value = func(state, *args, **kwargs)
    finally:
        ex.end()
    if not stream:
        ex.sync()
    return state


def shared_prefix(texts: list[str]) -> str:
    """The common leading text of ``texts``, cut before its last whitespace run (or "")."""
    common = os.path.commonprefix(texts) if texts else ""
    if all(t == common for t in texts):
        return common  # identical texts: nothing follows the prefix in any of them yet
    for k in range(len(common) - 1, 0, -1):
        if common[k].isspace() and not common[k - 1].isspace():
            return common[:k]
    return ""


def send_prefix_hint(func: Callable[..., Any], runs: list[Run], backend: Backend) -> Optional[str]:
    """Send the batch's shared leading text as a prefix hint; returns it (None if none)."""
    traces = [traced_prefix(func, backend, kwargs) for kwargs, _ in runs]
    texts = [t for t in traces if t is not None]
    prefix = shared_prefix(texts) if len(texts) >= 2 else ""
    loras = {defaults.lora_path for _, defaults in runs}
    if not prefix or len(loras) > 1:  # the cache is per LoRA adapter: one hint serves one adapter
        return None
    try:
        backend.cache_prefix(text=prefix, **lora_kw(loras.pop()))
    except Exception as e:  # a hint only: the programs report their own errors
        logger.warning("run_batch prefix hint failed: %s", e)
        return None
    return prefix


def resolve_threads(num_threads: Union[str, int], n: int) -> int:
    if num_threads == "auto":
        num_threads = max(96, multiprocessing.cpu_count() * 16)
    if not isinstance(num_threads, int) or num_threads < 1:
        raise ValueError(f"num_threads: must be 'auto' or a positive integer (got {num_threads!r})")
    return max(1, min(num_threads, n))


def run_batch(func: Callable[..., Any], runs: list[Run], *, num_threads: Union[str, int], progress_bar: bool,
              backend: Backend, precache: bool = True,
              generator_style: bool = False) -> Union[list[ProgramState], Iterator[ProgramState]]:
    """One state per run, in the order of ``runs``; an exception raised by a program body is
    re-raised after every run finished (when reached, with ``generator_style``)."""
    if not runs:
        return iter(()) if generator_style else []
    if precache and len(runs) >= 2:
        send_prefix_hint(func, runs, backend)
    pool = ThreadPoolExecutor(resolve_threads(num_threads, len(runs)), thread_name_prefix="run_batch")
    futures = [pool.submit(run_program, func, backend, (), kwargs, defaults) for kwargs, defaults in runs]
    pool.shutdown(wait=False)
    if generator_style:
        return _in_order(futures, progress_bar)
    if progress_bar:
        from tqdm.auto import tqdm

        for _ in tqdm(as_completed(futures), total=len(futures)):
            pass
    wait(futures)  # every run finishes before a program's error is raised
    return [f.result() for f in futures]


def _in_order(futures: list[Future], progress_bar: bool) -> Iterator[ProgramState]:
    """The futures' states in order as they complete (with a progress bar over them)."""
    if progress_bar:
        from tqdm.auto import tqdm

        futures = tqdm(futures, total=len(futures))
    for f in futures:
        yield f.result()
