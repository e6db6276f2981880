"""Warm restart end to end (``--cache-persist-dir``): servers of their own, restarted.

The tiny model covers the interval writer, the save on SIGTERM and the memory invariants after
a load; a corrupt, truncated or mismatched file (skipped with a warning; a cold start) is
checked through in-process Engines, which run the same worker store; SmolLM2 covers one real
model through the OpenAI route's usage."""
from __future__ import annotations

import logging
import os
import random
import time

import pytest

from radixserve.worker.persist.file_format import read_prefix_file
from radixserve.worker.persist.store import FILE_NAME
from tests.helpers.models import make_engine
from tests.helpers.server_harness import ServerHandle

GREEDY = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}


def _ids(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(200, 40000) for _ in range(n)]


SYSTEM, Q1, Q2 = _ids(1, 300), _ids(2, 20), _ids(3, 20)


def _serve(tiny_dir: str, folder: str, *extra: str) -> ServerHandle:
    return ServerHandle(tiny_dir, "--max-total-tokens", "4096", "--cache-persist-dir", folder, *extra).wait_ready()


def _generate(srv: ServerHandle, ids: list[int]) -> dict:
    with srv.client() as c:
        return c.post("/generate", json={"input_ids": ids, "sampling_params": GREEDY}).raise_for_status().json()


def _checked(srv: ServerHandle) -> dict:
    with srv.client() as c:
        s = c.get("/get_server_info", params={"check_invariants": True}).raise_for_status().json()["scheduler"]
    assert s["invariants_ok"], s["invariant_error"]
    return s


def _persisted(folder: str) -> list[list[int]]:
    """Every root-to-node token path in the file."""
    f = read_prefix_file(os.path.join(folder, FILE_NAME))
    paths: list[list[int]] = []
    for n in f.nodes:
        paths.append((paths[n.parent] if n.parent >= 0 else []) + n.tokens.tolist())
    return paths


def _holds(folder: str, ids: list[int]) -> bool:
    return any(p[:len(ids)] == ids for p in _persisted(folder))


def test_warm_restart_tiny(tiny_dir, tmp_path):
    folder = str(tmp_path / "kv")
    srv = _serve(tiny_dir, folder, "--cache-persist-interval", "0.5")
    try:
        before = _generate(srv, SYSTEM + Q1)
        assert before["meta_info"]["cached_tokens"] == 0
        deadline = time.time() + 60  # the interval writer, with the server still up
        while not (os.path.exists(os.path.join(folder, FILE_NAME)) and _holds(folder, SYSTEM + Q1)):
            assert time.time() < deadline, srv.log_tail()
            time.sleep(0.25)
    finally:
        srv.stop()
    assert srv.proc.returncode == 0, srv.log_tail()
    assert os.listdir(folder) == [FILE_NAME]  # no temporary file left under any name

    srv = _serve(tiny_dir, folder)  # interval 0: saved only at shutdown
    try:
        s = _checked(srv)
        assert s["cache_size"] >= len(SYSTEM + Q1) and s["held_slots"] == 0
        after = _generate(srv, SYSTEM + Q1)  # the first request after the restart
        assert after["meta_info"]["cached_tokens"] >= len(SYSTEM + Q1) - 1
        assert after["output_ids"] == before["output_ids"]
        other = _generate(srv, SYSTEM + Q2)
        assert other["meta_info"]["cached_tokens"] >= len(SYSTEM)
        assert not _holds(folder, SYSTEM + Q2)
        _checked(srv)
    finally:
        srv.stop()
    assert srv.proc.returncode == 0, srv.log_tail()
    assert _holds(folder, SYSTEM + Q2) and _holds(folder, SYSTEM + Q1)  # written on SIGTERM


@pytest.fixture(scope="module")
def good_file(tiny_dir, tmp_path_factory) -> tuple[bytes, dict]:
    """A prefix file an Engine wrote at shutdown, and the output before it (the store and the file
    are the server worker's; the server's own save path is test_warm_restart_tiny's)."""
    folder = str(tmp_path_factory.mktemp("kv"))
    eng = make_engine(tiny_dir, max_total_tokens=4096, cache_persist_dir=folder)
    before = eng.generate(input_ids=SYSTEM + Q1, sampling_params=GREEDY)
    eng.shutdown()
    with open(os.path.join(folder, FILE_NAME), "rb") as f:
        return f.read(), before


@pytest.mark.parametrize("problem", ["corrupt", "truncated", "dtype"])
def test_bad_file_is_skipped(tiny_dir, tmp_path, good_file, problem, caplog):
    folder = tmp_path / "kv"
    folder.mkdir()
    data, before = bytearray(good_file[0]), good_file[1]
    extra: dict = {}
    if problem == "corrupt":
        for at in (100, len(data) // 2, len(data) - 64):
            data[at] ^= 0x5A
    elif problem == "truncated":
        data = data[: len(data) - 4096]
    else:
        extra = {"dtype": "bfloat16"}  # another dtype: the file's KV does not apply
    (folder / FILE_NAME).write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        eng = make_engine(tiny_dir, max_total_tokens=4096, cache_persist_dir=str(folder), **extra)
    try:
        assert "skipping the prefix file" in caplog.text
        assert eng.stats()["cache_size"] == 0  # cold
        eng.check_invariants()
        after = eng.generate(input_ids=SYSTEM + Q1, sampling_params=GREEDY)
        assert after["meta_info"]["cached_tokens"] == 0
        if problem != "dtype":
            assert after["output_ids"] == before["output_ids"]
        eng.check_invariants()
    finally:
        eng.shutdown()


def test_warm_restart_smollm2(smol_dir, tmp_path):
    """SmolLM2, a chat with a long system prompt through the OpenAI route, restarted."""
    import openai

    folder = str(tmp_path / "kv")
    system = "You are a careful assistant. " + " ".join(f"Rule {i}: answer briefly and politely." for i in range(40))
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Name a primary color."}]

    def ask(srv: ServerHandle):
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120)
        return client.chat.completions.create(model="m", messages=messages, max_tokens=16, temperature=0)

    srv = ServerHandle(smol_dir, "--max-total-tokens", "4096", "--cache-persist-dir", folder).wait_ready()
    try:
        before = ask(srv)
        prompt_tokens = before.usage.prompt_tokens
        assert prompt_tokens > 400
    finally:
        srv.stop()
    srv = ServerHandle(smol_dir, "--max-total-tokens", "4096", "--cache-persist-dir", folder).wait_ready()
    try:
        after = ask(srv)
        assert after.usage.prompt_tokens_details.cached_tokens >= prompt_tokens - 1
        assert after.choices[0].message.content == before.choices[0].message.content
        _checked(srv)
    finally:
        srv.stop()
    assert srv.proc.returncode == 0, srv.log_tail()


def test_engine_warm_restart(tiny_dir, tmp_path):
    """The in-process Engine: restored at construction, saved by shutdown(); a pool too small
    for the file loads a prefix of it (at most half its free slots) and stays consistent."""
    from tests.helpers.models import make_engine

    folder = str(tmp_path / "kv")
    eng = make_engine(tiny_dir, cache_persist_dir=folder)
    before = eng.generate(input_ids=SYSTEM + Q1, sampling_params=GREEDY)
    eng.shutdown()
    eng = make_engine(tiny_dir, cache_persist_dir=folder)
    try:
        eng.check_invariants()
        after = eng.generate(input_ids=SYSTEM + Q1, sampling_params=GREEDY)
        assert after["meta_info"]["cached_tokens"] >= len(SYSTEM + Q1) - 1
        assert after["output_ids"] == before["output_ids"]
    finally:
        eng.shutdown()
    small = make_engine(tiny_dir, cache_persist_dir=folder, max_total_tokens=401)
    try:
        assert small.stats()["cache_size"] == 200  # half of the 400 usable slots
        small.check_invariants()
        out = small.generate(input_ids=SYSTEM + Q1, sampling_params=GREEDY)
        assert out["meta_info"]["cached_tokens"] == 200
        assert out["output_ids"] == before["output_ids"]
        small.check_invariants()
    finally:
        small._persister = None  # keep the full file: this engine must not overwrite it
        small.shutdown()


def test_worker_death_with_persistence(tiny_dir, tmp_path, good_file):
    """A dead model process (with one rank, the scheduler holds the model) cannot save: the server
    still goes down at once (no grace period spent waiting for a save that cannot happen) and the
    previous file stays intact."""
    import signal

    from tests.helpers.server_harness import pid_alive

    folder = tmp_path / "kv"
    folder.mkdir()
    (folder / FILE_NAME).write_bytes(good_file[0])
    srv = _serve(tiny_dir, str(folder), "--cache-persist-interval", "0")
    try:
        pids = srv.info()["pids"]
        os.kill(pids["scheduler"], signal.SIGKILL)
        assert srv.proc.wait(timeout=60) != 0  # far below the 120 s a save may take
        for name, pid in pids.items():
            assert not pid_alive(pid), f"{name} (pid {pid}) left behind"
    finally:
        srv.stop()
    assert (folder / FILE_NAME).read_bytes() == good_file[0]


def test_bench_warm_restart_short(tiny_dir):
    """The short version of benchmarks/bench_warm_restart.py (tiny model, 200-token prefix)."""

    from benchmarks.bench_warm_restart import run

    res = run(tiny_dir, 200, 2048)
    assert res["file_bytes"] > 0 and res["saved_tokens"] >= 200 and res["write_s"] is not None
    cold, warm = res["cold"], res["warm"]
    assert cold["cached_tokens"][0] == 0 and cold["cached_tokens"][1] >= 200 and cold["loaded_tokens"] == 0
    assert warm["cached_tokens"][0] >= 200 and warm["loaded_tokens"] >= 200 and warm["load_s"] is not None
    assert cold["first_hit_s"] is not None and warm["first_hit_s"] is not None
