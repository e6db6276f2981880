"""Start-up stages (radixserve/proc/stages.py): a line as each starts and ends, progress lines
while a slow one runs, only the innermost of nested stages beating, a failure named.  Fake
stages only: nothing here depends on how fast this machine is."""
from __future__ import annotations

import logging
import threading

import pytest

from radixserve.proc import stages


def lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "radixserve.stage"]


def wait_for(event: threading.Event) -> None:
    assert event.wait(30), "no heartbeat within 30 s"


def test_a_stage_logs_its_start_its_progress_and_its_end(caplog, monkeypatch):
    beats = threading.Event()
    real = stages.Progress.line
    monkeypatch.setattr(stages.Progress, "line", lambda self: (beats.set(), real(self))[1])
    with caplog.at_level(logging.INFO, logger="radixserve.stage"):
        with stages.stage("numerics timing", "3 paths", total=3, unit="paths", heartbeat=0.01) as p:
            p.step("float32")
            p.working_on("bfloat16")
            wait_for(beats)  # a slow stage: the heartbeat thread reports while it runs
            p.step()
            p.result("measured")
    got = lines(caplog)
    assert got[0] == "numerics timing: started (3 paths)"
    assert got[-1].startswith("numerics timing: done in ") and got[-1].endswith(" s (measured)")
    beat = [line for line in got[1:-1] if line.startswith("numerics timing: [")]
    assert beat, got
    assert "/3 paths," in beat[0] and beat[0].endswith("(bfloat16)")
    assert all(line.startswith("numerics timing: ") for line in got)


def test_no_heartbeat_after_the_end_and_a_failure_is_named(caplog):
    with caplog.at_level(logging.INFO, logger="radixserve.stage"):
        with pytest.raises(RuntimeError, match="no compiler"):
            with stages.stage("kernels", heartbeat=0.01):
                raise RuntimeError("no compiler")
        count = len(lines(caplog))
        threading.Event().wait(0.1)
    got = lines(caplog)
    assert len(got) == count, "the heartbeat stopped with the stage"
    assert got[0] == "kernels: started" and got[-1].startswith("kernels: failed after ")
    assert got[-1].endswith("RuntimeError: no compiler")
    assert stages.current().name == ""  # nothing left running


def test_only_the_innermost_stage_beats_and_notes_are_one_line(caplog, monkeypatch):
    inner_beat = threading.Event()
    real = stages.Progress.line

    def line(self):
        if self.name == "accuracy check":
            inner_beat.set()
        return real(self)

    monkeypatch.setattr(stages.Progress, "line", line)
    with caplog.at_level(logging.INFO, logger="radixserve.stage"):
        with stages.stage("KV pool", heartbeat=0.01):
            with stages.stage("accuracy check", heartbeat=0.01) as inner:
                assert stages.current() is inner
                inner.working_on("the fp32 reference")
                wait_for(inner_beat)
                outer_before = [x for x in lines(caplog) if x.startswith("KV pool: still")]
                threading.Event().wait(0.05)
                outer_after = [x for x in lines(caplog) if x.startswith("KV pool: still")]
        stages.note("download", "none (a local model)")
    got = lines(caplog)
    assert outer_before == outer_after, "the outer stage stays quiet while an inner one runs"
    assert any(x.startswith("accuracy check: still running,") and x.endswith("(the fp32 reference)") for x in got)
    names = [x.split(":")[0] for x in got if x.split(": ")[1].startswith(("started", "done"))]
    assert names == ["KV pool", "accuracy check", "accuracy check", "KV pool"]
    assert got[-1] == "download: none (a local model)"
