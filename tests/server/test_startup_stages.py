"""A first start prints one line per stage, in order (radixserve/proc/stages.py): the tiny model
served with ``--dtype auto`` from an empty ``$RADIXSERVE_CACHE`` (the compiled kernels linked in,
so that nothing is compiled here), then started again on the caches it wrote.  Nothing here
depends on how long a stage takes or on which numerics the timing picks."""
from __future__ import annotations

import os
import re

import pytest

from radixserve.kernels import cpu_native
from radixserve.model import loader

from tests.helpers.server_harness import ServerHandle

pytestmark = pytest.mark.skipif(not cpu_native.load(), reason="no C++ compiler: no kernels stage")

ORDER = ("download", "conversion", "kernels", "numerics timing", "accuracy check", "weights", "KV pool", "ready")


def stage_lines(log: str) -> list[tuple[str, str, str]]:
    """(process, stage, what) of every stage line of a server log, in order."""
    out = []
    for m in re.finditer(r"^\[\S+ \S+ (\w+)\] INFO radixserve\.stage: ([A-Za-z ]+): (.*)$", log, re.M):
        out.append(m.groups())
    return out


def start(tiny_dir: str) -> str:
    srv = ServerHandle(tiny_dir, "--dtype", "auto", "--dense-kernel", "auto", "--max-total-tokens", "2048",
                       "--log-level", "info")
    try:
        srv.wait_ready()
    finally:
        srv.stop()
    with open(srv.log_path) as f:
        return f.read()


def test_a_first_start_logs_each_stage_in_order_and_a_warm_one_reads_its_caches(tiny_dir, tmp_path, monkeypatch):
    kernels = os.path.join(loader.cache_root(), "kernels")
    cache = tmp_path / "cache"
    cache.mkdir()
    os.symlink(kernels, cache / "kernels")
    monkeypatch.setenv("RADIXSERVE_CACHE", str(cache))

    log = start(tiny_dir)
    got = stage_lines(log)
    seen = [s for _, s, _ in got]
    assert all(s in seen for s in ORDER if s != "accuracy check"), log[-3000:]  # (checked only if a quantization won)
    firsts = [seen.index(s) for s in ORDER if s in seen]
    assert firsts == sorted(firsts), seen  # each stage's first line comes after the previous stage's
    by = {s: [(p, w) for p, s2, w in got if s2 == s] for s in ORDER}
    for s in ("numerics timing", "weights", "KV pool"):  # run on this start: a start and an end line
        assert by[s][0][1].startswith("started") and by[s][-1][1].startswith("done in "), by[s]
        assert "server" not in {p for p, _ in by[s]}  # (the process that holds the model)
    assert by["download"] == [("server", "none (a local model)")]
    assert by["conversion"] == [("server", "none (a Hugging Face directory)")]
    assert by["kernels"][0][0] != "server" and by["kernels"][0][1].startswith("cached")
    assert by["ready"][0][0] == "server" and by["ready"][0][1].startswith("model ready in ")

    # the warm start: the same stages, the kernels and the accuracy check from their caches (whether the
    # numerics tables are read or retaken depends on the machine's load: noise.py; not checked here)
    warm = [(s, w) for _, s, w in stage_lines(start(tiny_dir))]
    assert ("kernels", "cached") in [(s, w.split(" ")[0]) for s, w in warm], warm
    assert "numerics timing" in [s for s, _ in warm]
    assert [s for s, _ in warm if s in ("weights", "KV pool", "ready")][-1] == "ready"
