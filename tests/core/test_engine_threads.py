"""``Engine`` from many threads at once: 8 threads start together with mixed prompt lengths,
n > 1, batched input, constrained requests (regex, choices) and streaming; every output equals
the same request run alone, and afterwards no request holds a KV slot and the allocator's
invariants hold."""
from __future__ import annotations

import re
import threading

import pytest

from tests.helpers.models import make_engine

LONG = list(range(3000, 3200))  # 200 tokens, shared by two threads' prompts
CASES = [  # (kind, kwargs): kind "gen" calls generate, "stream" consumes generate_stream
    ("gen", dict(input_ids=LONG + [7, 8], sampling_params={"max_new_tokens": 16, "temperature": 0})),
    ("gen", dict(input_ids=[11, 12], sampling_params={"max_new_tokens": 24, "temperature": 0})),
    ("gen", dict(input_ids=LONG[:120], sampling_params={"max_new_tokens": 10, "temperature": 1.0, "seed": 7,
                                                        "n": 3})),
    ("gen", dict(prompt="Reply with letters:", sampling_params={"regex": "[a-c]{5}", "temperature": 0,
                                                                "max_new_tokens": 12})),
    ("stream", dict(input_ids=[40, 41, 42], sampling_params={"max_new_tokens": 20, "temperature": 0})),
    ("gen", dict(input_ids=[[5] * 30, LONG + [9], [6, 7, 8]], sampling_params={"max_new_tokens": 8,
                                                                                "temperature": 0})),
    ("stream", dict(prompt="Pick one:", sampling_params={"choices": ["alpha beta", "gamma"], "temperature": 0})),
    ("stream", dict(input_ids=[[60, 61], [70] * 50], sampling_params={"max_new_tokens": 12, "temperature": 0,
                                                                     "n": 2, "seed": 3})),
]
ROUNDS = 3


def run_case(eng, kind: str, kw: dict) -> list[dict]:
    """The final result dicts of one case, as a list."""
    if kind == "gen":
        out = eng.generate(**kw)
        return out if isinstance(out, list) else [out]
    last: dict[int, dict] = {}
    for ch in eng.generate_stream(**kw):
        prev = last.get(ch["index"])
        assert prev is None or ch["text"].startswith(prev["text"])
        last[ch["index"]] = ch
    return [last[i] for i in sorted(last)]


def key(outs: list[dict]) -> list[tuple]:
    return [(o["text"], o["output_ids"], o["meta_info"]["finish_reason"]) for o in outs]


def test_eight_threads_at_once(tiny_dir):
    eng = make_engine(tiny_dir, max_total_tokens=4096, chunked_prefill_size=64)
    alone = [key(run_case(eng, kind, kw)) for kind, kw in CASES]  # one at a time: the reference
    assert re.fullmatch("[a-c]{5}", alone[3][0][0]) and alone[6][0][0] in ("alpha beta", "gamma")
    assert len(alone[2]) == 3 and len(alone[7]) == 4
    eng.flush_cache()

    start = threading.Barrier(len(CASES))
    results: dict[int, list] = {}
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        kind, kw = CASES[i]
        try:
            start.wait(timeout=60)
            results[i] = [key(run_case(eng, kind, kw)) for _ in range(ROUNDS)]
        except BaseException as e:  # reported below, in the test thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(CASES))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a thread never finished"
    assert not errors, errors
    for i, want in enumerate(alone):
        assert results[i] == [want] * ROUNDS, (i, CASES[i])

    s = eng.stats()
    assert s["running"] == 0 and s["waiting"] == 0
    assert s["num_slots"] - s["free_slots"] - s["cache_size"] == 0  # no slot held by a request
    eng.check_invariants()


def test_admin_calls_from_threads_while_generating(tiny_dir):
    """stats / check_invariants / flush_cache run on the driver thread between steps, so they
    never race a step, even while other threads generate."""
    eng = make_engine(tiny_dir, max_total_tokens=2048)
    stop = threading.Event()
    checks = []

    def admin() -> None:
        while not stop.is_set():
            eng.check_invariants()
            checks.append(eng.stats()["num_slots"])
            eng.flush_cache()  # refused (False) while requests run; never breaks them

    t = threading.Thread(target=admin)
    t.start()
    try:
        outs = [eng.generate(input_ids=[i, i + 1, i + 2], sampling_params={"max_new_tokens": 12, "temperature": 0,
                                                                          "ignore_eos": True})
                for i in range(100, 110)]
    finally:
        stop.set()
        t.join(timeout=60)
    assert checks and all(len(o["output_ids"]) == 12 for o in outs)
    eng.check_invariants()


def test_every_step_runs_on_the_driver_thread(tiny_engine):
    """The model is stepped on the driver's one thread whoever calls: the main thread, another
    thread, an asyncio caller (torch's OpenMP gives each thread running torch work a thread team
    of its own, and two teams slow each other down: ``engine/driver.py``)."""
    import asyncio

    eng = tiny_engine
    seen: list[str] = []
    hook = lambda req: seen.append(threading.current_thread().name)  # noqa: E731 - runs when a request finishes
    eng.run_on_driver(lambda s: s.hooks.append(hook))
    driver = eng._driver._thread.name
    try:
        eng.generate(input_ids=[5, 6, 7], sampling_params={"max_new_tokens": 4, "temperature": 0})
        out = {}
        t = threading.Thread(target=lambda: out.setdefault("o", eng.generate(input_ids=[[5, 6], [8, 9]], sampling_params={
            "max_new_tokens": 4, "temperature": 0})), name="caller-thread")
        t.start()
        t.join(timeout=120)
        assert len(out["o"]) == 2
        list(eng.generate_stream(input_ids=[5, 6, 7], sampling_params={"max_new_tokens": 4, "temperature": 0}))
        asyncio.run(eng.async_generate(input_ids=[5, 6, 7], sampling_params={"max_new_tokens": 4, "temperature": 0}))
        assert seen == [driver] * 5 and driver != threading.current_thread().name
    finally:
        eng.run_on_driver(lambda s: s.hooks.remove(hook))
    eng.check_invariants()


def test_the_model_is_built_on_the_driver_thread_and_the_engine_is_collectable(tiny_dir, monkeypatch):
    """The worker's construction (its torch work: weights, KV pool, timings) runs on the thread
    that steps it; a failing build raises in the constructing thread; an engine nobody holds is
    stopped by the garbage collector (the driver's thread keeps no reference to it)."""
    import gc
    import weakref

    import radixserve.engine.engine as engine_mod

    built_on: list[str] = []
    real = engine_mod.build_worker

    def recording(*a, **kw):
        built_on.append(threading.current_thread().name)
        return real(*a, **kw)

    monkeypatch.setattr(engine_mod, "build_worker", recording)
    eng = make_engine(tiny_dir, max_total_tokens=512)
    driver = eng._driver
    assert built_on == [driver._thread.name] != [threading.current_thread().name]
    assert eng.generate(input_ids=[5, 6], sampling_params={"max_new_tokens": 2})["meta_info"]["completion_tokens"] == 2
    ref = weakref.ref(eng)
    del eng
    gc.collect()
    assert ref() is None
    driver._thread.join(timeout=30)
    assert not driver._thread.is_alive()

    def failing(*a, **kw):
        raise ValueError("model: no weights here")

    monkeypatch.setattr(engine_mod, "build_worker", failing)
    with pytest.raises(ValueError, match="no weights here"):
        make_engine(tiny_dir, max_total_tokens=512)


def test_a_callback_cannot_wait_for_the_engine(tiny_engine):
    """Waiting for the engine from the thread that steps it would deadlock: it raises instead."""
    errors = []

    def on_update(state) -> None:
        try:
            tiny_engine.generate(input_ids=[1, 2], sampling_params={"max_new_tokens": 1})
        except RuntimeError as e:
            errors.append(str(e))

    fut, _, _ = tiny_engine.submit(input_ids=[3, 4], sampling_params={"max_new_tokens": 2, "temperature": 0},
                                   on_update=on_update)
    fut.result(timeout=120)
    assert errors and "cannot wait for the engine" in errors[0]
    tiny_engine.check_invariants()
