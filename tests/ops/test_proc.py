"""Child processes (``radixserve.proc``): the process name that top/ps and bench_process_cpu.py
read, and the one ``Supervisor`` behind every launcher: readiness, a dead child named with its
exit, SIGINT/SIGTERM/SIGHUP ignored by children, the ordered stop with a grace period (cut
short when a needed child is gone, SIGKILL after it), and no hang at interpreter exit."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from radixserve.proc import STOP_SIGNAL, ChildDied, ChildExit, Supervisor
from tests.helpers import proc_children
from tests.helpers.server_harness import pid_alive


def test_set_process_name_shows_in_proc_comm():
    code = ("from radixserve.proc import set_process_name; set_process_name('rs-worker-and-more');"
            "print(open('/proc/self/comm').read().strip())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "rs-worker-and-m"  # Linux keeps 15 bytes


def _wait_dead(sup: Supervisor, bound: float = 30.0) -> ChildExit:
    deadline = time.monotonic() + bound  # a hang guard
    while (dead := sup.dead()) is None:
        assert time.monotonic() < deadline, "no child reported dead"
        time.sleep(0.05)
    return dead


def _stop_guarded(sup: Supervisor, order: tuple[str, ...] = (), bound: float = 30.0) -> None:
    """``sup.stop(order)``, failing instead of hanging when it outlasts ``bound``."""
    t = threading.Thread(target=sup.stop, args=(order,), daemon=True)
    t.start()
    t.join(bound)
    assert not t.is_alive(), f"stop still waiting after {bound}s"


def test_ready_then_a_dead_child_is_named_with_its_exit():
    sup = Supervisor()
    try:
        sup.start("a", proc_children.idle, "A")
        sup.start("b", proc_children.idle, "B")
        assert sup.wait_ready(timeout=60) == {"a": "A", "b": "B"}
        assert sup.dead() is None
        os.kill(sup.pids["b"], signal.SIGKILL)
        dead = _wait_dead(sup)
        assert dead == ChildExit("b", -signal.SIGKILL)
        assert str(dead) == "b process exited with code -9 (SIGKILL)"
    finally:
        _stop_guarded(sup)
    assert not any(pid_alive(pid) for pid in sup.pids.values())


def test_a_child_that_exits_during_startup_raises_child_died():
    sup = Supervisor()
    try:
        sup.start("a", proc_children.idle, "A")
        sup.start("early", proc_children.exit_at_once, 3)
        with pytest.raises(ChildDied) as e:
            sup.wait_ready(timeout=60)
        assert e.value.exit == ChildExit("early", 3)
        assert "early process exited with code 3 during startup" in str(e.value)
    finally:
        _stop_guarded(sup)


def test_children_ignore_group_signals_and_end_on_the_stop_request():
    sup = Supervisor()
    try:
        sup.start("a", proc_children.idle, "A")
        sup.wait_ready(timeout=60)
        pid = sup.pids["a"]
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # what a group signal delivers
            os.kill(pid, sig)
        time.sleep(0.3)
        assert sup.dead() is None and pid_alive(pid)
    finally:
        _stop_guarded(sup)
    assert sup.children["a"].process.exitcode == -STOP_SIGNAL  # the default action, not SIGKILL


def test_stop_in_order_lets_a_child_finish_within_its_grace(tmp_path):
    marker = str(tmp_path / "saved")
    sup = Supervisor()
    try:
        sup.start("helper", proc_children.idle, "H")
        sup.start("saver", proc_children.finish_on_stop, 0.5, marker, grace=60, needs=("helper",))
        sup.wait_ready(timeout=60)
    finally:
        _stop_guarded(sup, ("saver", "helper"))
    assert open(marker).read() == "saved"
    assert sup.children["saver"].process.exitcode == 0
    assert sup.children["helper"].process.exitcode == -STOP_SIGNAL


def test_grace_ends_when_a_needed_child_is_gone_and_sigkill_follows(tmp_path):
    sup = Supervisor()
    try:
        sup.start("helper", proc_children.idle, "H")
        sup.start("deaf", proc_children.deaf, grace=600, needs=("helper",))  # the guard fails long before 600 s
        sup.wait_ready(timeout=60)
        os.kill(sup.pids["helper"], signal.SIGKILL)
        _wait_dead(sup)
    finally:
        _stop_guarded(sup, ("deaf",))
    assert sup.children["deaf"].process.exitcode == -signal.SIGKILL


def test_a_child_ignoring_the_stop_request_is_killed_after_its_grace():
    sup = Supervisor()
    try:
        sup.start("deaf", proc_children.deaf, grace=0.5)
        sup.wait_ready(timeout=60)
    finally:
        _stop_guarded(sup)
    assert sup.children["deaf"].process.exitcode == -signal.SIGKILL


def test_interpreter_exit_stops_children_without_hanging():
    """multiprocessing's exit handler SIGTERMs daemon children and joins them without a
    timeout: the supervisor stops its children first (they ignore SIGTERM)."""
    code = ("from radixserve.proc import Supervisor; from tests.helpers import proc_children\n"
            "sup = Supervisor(); sup.start('a', proc_children.idle, 'A'); sup.wait_ready(timeout=60)\n"
            "print(sup.pids['a'], flush=True)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert not pid_alive(int(proc.stdout.split()[0]))
