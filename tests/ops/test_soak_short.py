"""The bounded version of benchmarks/soak.py on the tiny model: 120 mixed requests at
concurrency 16 while the detokenizer is stalled, the worker is killed once (the server must
exit non-zero and the restarted one serve) and a tiny KV pool (256 slots) and queue (12) meet
16 clients (retractions are reported; tests/server/test_memory_pressure.py asserts them).
Zero lost, zero wrong, zero leaked slots, invariants OK; RSS growth is reported only."""
from __future__ import annotations


from benchmarks import soak


def test_short_soak_with_faults(tiny_dir):
    args = soak.parser().parse_args([
        "--model", tiny_dir, "--requests", "120", "--concurrency", "16", "--seed", "1",
        "--max-total-tokens", "8192", "--pressure-tokens", "256", "--pressure-queue", "12",
        "--stalls", "2", "--stall-s", "1.0", "--stall-gap-s", "0.5", "--deadline-s", "60", "--max-minutes", "4"])
    summary = soak.run_soak(args)
    print(soak.human(summary))
    failed = {k: v for k, v in summary["checks"].items() if not v}
    assert not failed, (failed, [p["examples"] for p in summary["phases"]], summary["faults"])
    counts = summary["counts"]
    assert sum(counts.values()) == 120 and counts["not_run"] == 0
    assert counts.get("rejected", 0) > 0  # the oversize requests were refused with a 400
    assert counts.get("server_down", 0) + counts.get("ok", 0) > 0
    assert any("SIGSTOP detokenizer" in line for line in summary["faults"])
    assert summary["server_exit_codes"][0] not in (0, None)  # the worker kill took the server down
    kinds = {p["phase"]: p for p in summary["phases"]}
    assert kinds["pressure"]["held_slots"] == 0 and kinds["pressure"]["requests"] > 0
