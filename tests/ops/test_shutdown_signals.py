"""Every signal a supervisor may send stops ``radixserve serve --cache-persist-dir`` in
seconds: SIGTERM or SIGINT, to the main process or to its whole process group (systemd's
``KillMode=control-group``, ``kill -- -PGID``, Ctrl-C), once or twice (the second during the
orderly stop).  Each exits 0, leaves no child behind and writes a valid prefix file (the
worker is alive to save it); one case restarts on the file and gets a cache hit."""
from __future__ import annotations

import functools
import os
import signal
import subprocess
import time
from unittest import mock

import pytest

from radixserve.worker.persist.file_format import read_prefix_file
from radixserve.worker.persist.store import FILE_NAME
from tests.helpers.server_harness import ServerHandle, pid_alive

PROMPT = list(range(1000, 1300))
GREEDY = {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}
EXIT_BOUND_S = 30.0  # a hang guard: a stop takes a few seconds


class GroupServer(ServerHandle):
    """A tiny-model server with warm restart, leading a process group of its own."""

    def __init__(self, model: str, folder: str) -> None:
        with mock.patch.object(subprocess, "Popen", functools.partial(subprocess.Popen, start_new_session=True)):
            super().__init__(model, "--max-total-tokens", "4096", "--cache-persist-dir", folder,
                             "--log-level", "info")

    def send(self, sig: signal.Signals, to_group: bool) -> None:
        if to_group:
            os.killpg(self.proc.pid, sig)
        else:
            self.proc.send_signal(sig)

    def wait_for_log(self, text: str, bound: float = EXIT_BOUND_S) -> None:
        """Until ``text`` is in the log or the process exited (or ``bound`` passed)."""
        deadline = time.monotonic() + bound
        while text not in self.log_tail(10**6) and self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)


def _generate(srv: ServerHandle) -> dict:
    with srv.client() as c:
        return c.post("/generate", json={"input_ids": PROMPT, "sampling_params": GREEDY}).raise_for_status().json()


# every pair of (signal, to the main process or its group, once or twice): four servers, not eight
PAIRWISE = [(signal.SIGTERM, True, 1), (signal.SIGTERM, False, 2), (signal.SIGINT, False, 1), (signal.SIGINT, True, 2)]


@pytest.mark.parametrize("sig,to_group,times", PAIRWISE,
                         ids=[f"{s.name[3:]}-{'group' if g else 'main'}-{t}" for s, g, t in PAIRWISE])
def test_signal_stops_the_server_and_saves_the_cache(tiny_dir, tmp_path, sig, to_group, times):
    folder = str(tmp_path / "kv")
    srv = GroupServer(tiny_dir, folder).wait_ready()
    try:
        _generate(srv)
        pids = srv.info()["pids"]
        srv.send(sig, to_group)
        if times == 2:
            srv.wait_for_log("Finished server process")  # uvicorn stopped: the children's stop begins
            if srv.proc.poll() is None:
                srv.send(sig, to_group)
        try:
            rc = srv.proc.wait(EXIT_BOUND_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running {EXIT_BOUND_S}s after {sig.name} x{times}:\n{srv.log_tail()}")
    finally:
        if srv.proc.poll() is None:
            os.killpg(srv.proc.pid, signal.SIGKILL)
        srv.stop()
    assert rc == 0, srv.log_tail()
    for name, pid in pids.items():
        assert not pid_alive(pid), f"{name} (pid {pid}) left behind"
    assert read_prefix_file(os.path.join(folder, FILE_NAME)).num_tokens >= len(PROMPT), srv.log_tail()

    if (sig, to_group, times) == (signal.SIGTERM, True, 1):  # systemd's stop: the restart loads the file
        srv = ServerHandle(tiny_dir, "--max-total-tokens", "4096", "--cache-persist-dir", folder).wait_ready()
        try:
            assert _generate(srv)["meta_info"]["cached_tokens"] >= len(PROMPT) - 1
        finally:
            srv.stop()
