"""Start the real multi-process server (``radixserve serve``) on a free loopback port.

``shared_server(tiny_dir)`` returns one server per test session (the tiny random Llama,
API key ``sk-test``), so every tests/test_server*.py module reuses it.
"""
from __future__ import annotations

import atexit
import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Optional

import httpx

from tests.helpers.models import pinned_dense_kernel

API_KEY = "sk-test"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:  # runs in the child before exec
    ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)


class ServerHandle:
    def __init__(self, model: str, *extra: str, api_key: Optional[str] = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # fp32 on the pinned dense path, whatever this machine's timing would pick (``extra`` may override)
        cmd = [sys.executable, "-m", "radixserve.cli", "serve", "--model", model, "--port", str(self.port),
               "--dtype", "float32", "--dense-kernel", pinned_dense_kernel(model), "--log-level", "warning", *extra]
        if api_key:
            cmd += ["--api-key", api_key]
        self.log_path = tempfile.mktemp(prefix="radixserve-server-", suffix=".log")
        self._log = open(self.log_path, "w")
        env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                     preexec_fn=_die_with_parent)

    def log_tail(self, n: int = 4000) -> str:
        with open(self.log_path) as f:
            return f.read()[-n:]

    def wait_ready(self, timeout: float = 240.0) -> "ServerHandle":
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"server not ready after {timeout}s:\n{self.log_tail()}")

    def client(self, **kw) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=kw.pop("timeout", 60), **kw)

    def info(self) -> dict:
        with self.client() as c:
            return c.get("/get_server_info").raise_for_status().json()

    def wait_idle(self, timeout: float = 30.0) -> dict:
        """Server info once no request is in flight anywhere."""
        deadline = time.time() + timeout
        while True:
            info = self.info()
            s = info["scheduler"]
            if (s["running"] == 0 and s["waiting"] == 0 and info["in_flight_requests"] == 0) or time.time() > deadline:
                return info
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


_shared: Optional[ServerHandle] = None


def shared_server(tiny_dir: str) -> ServerHandle:
    """The session's tiny-model server (started on first use, stopped at exit)."""
    global _shared
    if _shared is None or _shared.proc.poll() is not None:
        _shared = ServerHandle(tiny_dir, "--max-total-tokens", "8192", "--chunked-prefill-size", "256",
                               api_key=API_KEY)
        atexit.register(_shared.stop)
        _shared.wait_ready()
    return _shared


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def process_names(root: int) -> dict[int, str]:
    """``root`` ("server") and its live descendants, by pid, named as in ``/proc/PID/comm``."""
    names, todo = {root: "server"}, [root]
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                kids = [int(k) for k in f.read().split()]
        except OSError:
            continue
        for k in kids:
            try:
                with open(f"/proc/{k}/comm") as f:
                    names[k] = f.read().strip()
            except OSError:  # gone meanwhile
                continue
            todo.append(k)
    return names
