"""The in-process runtime: ``Engine`` (scheduler + local or TP model worker in this process).

Owns: the Engine's public API (``engine.py``), the thread that steps the scheduler
(``driver.py``) and the futures/queues that collect each request's outputs (``groups.py``).
Must not touch: HTTP (``radixserve.server``) or the process launcher; it drives the same
``Scheduler`` and ``RequestBuilder`` the server's processes use, only in one process.  The
scheduler is stepped by one thread at a time (``EngineDriver``): other code reaches it only
through ``Engine.run_on_driver``, between steps.

Public names: ``Engine``.
"""
from radixserve.engine.engine import Engine

__all__ = ["Engine"]
