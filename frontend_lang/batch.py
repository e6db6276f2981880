"""``run_batch``: many runs of one program on a thread pool, after a shared-prefix hint.

Before a batch of two or more programs runs, each is dry-run up to its first model call
(tracer.py); the longest text common to all of them, cut back to just before a run of
whitespace (so the cut falls on a token boundary of the full prompts in practice), is
sent once with max_new_tokens 0.  Every program's first request then hits that cached
prefix instead of all of them prefilling it at the same time.  Program bodies therefore
run their code up to the first gen/select twice (once traced); pass ``precache=False`` if
that matters.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any, Optional, Union

from frontend_lang.backend.base import Backend
from frontend_lang.program import SglFunction, run_program
from frontend_lang.state import ProgramState
from frontend_lang.tracer import traced_prefix

logger = logging.getLogger(__name__)


def shared_prefix(texts: list[str]) -> str:
    """The common leading text of ``texts``, cut before its last whitespace run (or "")."""
    common = os.path.commonprefix(texts) if texts else ""
    if all(t == common for t in texts):
        return common  # identical texts: nothing follows the prefix in any of them yet
    for k in range(len(common) - 1, 0, -1):
        if common[k].isspace() and not common[k - 1].isspace():
            return common[:k]
    return ""


def send_prefix_hint(program: SglFunction, runs: list[tuple[dict[str, Any], Any]], backend: Backend) -> Optional[str]:
    """Send the batch's shared leading text as a prefix hint; returns it (None if none)."""
    traces = [traced_prefix(program.func, backend, kwargs) for kwargs, _ in runs]
    texts = [t for t in traces if t is not None]
    prefix = shared_prefix(texts) if len(texts) >= 2 else ""
    if not prefix:
        return None
    try:
        backend.cache_prefix(text=prefix)
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


def run_batch(program: SglFunction, batch_kwargs: list[dict[str, Any]], *, num_threads: Union[str, int],
              progress_bar: bool, backend: Backend, precache: bool = True,
              sampling: Optional[dict[str, Any]] = None) -> list[ProgramState]:
    """States in the order of ``batch_kwargs``; an exception raised by a program body is
    re-raised after every run finished."""
    if not batch_kwargs:
        return []
    runs = [program.split_kwargs({**(sampling or {}), **kw}) for kw in batch_kwargs]
    if precache and len(runs) >= 2:
        send_prefix_hint(program, runs, backend)
    with ThreadPoolExecutor(resolve_threads(num_threads, len(runs)), thread_name_prefix="run_batch") as pool:
        futures = [pool.submit(run_program, program.func, backend, (), kwargs, defaults) for kwargs, defaults in runs]
        if progress_bar:
            from tqdm.auto import tqdm

            for _ in tqdm(as_completed(futures), total=len(futures)):
                pass
        return [f.result() for f in futures]
