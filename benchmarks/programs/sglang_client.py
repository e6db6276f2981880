"""SGLang's own client (``sglang==0.5.10.post1``'s frontend language) running the suite's
programs against a radixserve server: the same program bodies, with their ``gen`` / ``select``
/ roles / ``@function`` taken from ``sglang`` instead of ``frontend_lang``, run by SGLang's
``run_batch`` over ``sglang.RuntimeEndpoint``.

``import_sglang()`` imports it the way the test suite does (``sglang.srt.utils`` imports
``torchvision.io.decode_jpeg`` at import time and PyPI's torchvision is CUDA-only: a stub
stands in while SGLang's modules load, then is removed).
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import time
import types
from typing import Any

from benchmarks.programs.spec import Workload

DSL_NAMES = ("function", "gen", "select", "system", "user", "assistant", "system_begin", "system_end",
             "user_begin", "user_end", "assistant_begin", "assistant_end")


def import_sglang() -> types.ModuleType:
    """``import sglang`` (ImportError when it is not installed: ``make install`` puts it in the venv)."""
    import transformers  # noqa: F401  (its availability checks must not see the stub)

    stubbed = "torchvision" not in sys.modules and importlib.util.find_spec("torchvision") is None
    if stubbed:
        tv, io = types.ModuleType("torchvision"), types.ModuleType("torchvision.io")
        tv.__spec__ = importlib.machinery.ModuleSpec("torchvision", None)
        io.__spec__ = importlib.machinery.ModuleSpec("torchvision.io", None)
        io.decode_jpeg, tv.io = None, io
        sys.modules.update({"torchvision": tv, "torchvision.io": io})
    try:
        import sglang
        import sglang.test.test_programs  # noqa: F401
    finally:
        if stubbed:
            del sys.modules["torchvision"], sys.modules["torchvision.io"]
    return sglang


def as_sglang(fn: Any, sgl: types.ModuleType) -> Any:
    """The SGLang ``@function`` with ``fn``'s body, its DSL names bound to SGLang's."""
    raw = fn.func
    names = {n: getattr(sgl, n) for n in DSL_NAMES if n in raw.__code__.co_names and hasattr(sgl, n)}
    body = types.FunctionType(raw.__code__, {**raw.__globals__, **names}, raw.__name__, raw.__defaults__,
                              raw.__closure__)
    body.__kwdefaults__ = raw.__kwdefaults__
    return sgl.function(body)


def run_cell_sglang(wl: Workload, backend: Any, concurrency: int, sgl: types.ModuleType) -> dict[str, Any]:
    """All of ``wl``'s runs through SGLang's ``run_batch`` on ``concurrency`` threads (its own
    prefix caching of the batch included); it gives no per-program times."""
    program = as_sglang(wl.function, sgl)
    t0 = time.perf_counter()
    states = program.run_batch([dict(kw) for kw in wl.args], backend=backend, num_threads=concurrency,
                               **wl.sampling)
    wall = time.perf_counter() - t0
    for st in states:
        err = st.error()
        if err is not None:
            raise err
    return {"programs": len(states), "wall_s": wall, "programs_per_s": len(states) / wall,
            "latency_p50_s": None, "latency_p99_s": None, "outputs": [wl.outputs(st) for st in states]}
