"""benchmarks/programs/report.py on a made-up run: the ratio against vLLM's faster configuration
per cell, the geometric mean, and radixserve over HTTP against in process."""
from __future__ import annotations

from benchmarks.programs.report import render


def _cell(pps: float, computed: float, outputs: list) -> dict:
    return {"programs_per_s": pps, "latency_p50_s": 1.0, "latency_p99_s": 2.0, "computed_per_program": computed,
            "counters": {"hit_rate": 0.5}, "outputs": outputs}


def _report() -> dict:
    def eng(cells: dict[str, dict[str, dict]]) -> dict:
        return {"workloads": {w: {"cells": c} for w, c in cells.items()}}

    return {
        "machine": {"cpu": "test CPU", "cpus": 2, "flags": ["avx2"]}, "model": "m", "dtype": "float32",
        "vllm_dtype": "float32", "levels": [[1, 2], [8, 8]],
        "engines": {
            "radixserve-http": eng({"a": {"1": _cell(2.0, 100, ["x", "y"]), "8": _cell(8.0, 50, ["x"] * 8)},
                                    "b": {"1": _cell(0.85, 100, ["z", "z"]), "8": _cell(3.0, 50, ["z"] * 8)}}),
            "radixserve": eng({"a": {"1": _cell(2.0, 100, ["x", "y"]), "8": _cell(8.0, 50, ["x"] * 8)},
                               "b": {"1": _cell(1.0, 100, ["z", "z"]), "8": _cell(3.0, 50, ["z"] * 8)}}),
            "vllm-offline": eng({"a": {"1": _cell(1.0, 400, ["x", "n"]), "8": _cell(2.0, 200, ["x"] * 8)},
                                 "b": {"1": _cell(0.5, 200, ["z", "z"]), "8": _cell(1.0, 100, ["z"] * 8)}}),
            "vllm-server": eng({"a": {"1": _cell(0.5, 400, ["x", "y"]), "8": _cell(4.0, 200, ["x"] * 8)}}),
            "llama.cpp": {"skipped": "not installed"},
        },
    }


def test_the_summary_takes_vllms_faster_configuration_per_cell_and_the_geometric_mean():
    text = render(_report())
    # a, C=1: offline 1.0 beats server 0.5 -> 2.00x; a, C=8: server 4.0 -> 2.00x; b: offline only
    assert "| a | 2.00x vs offline (work 4.00x) | 2.00x vs server (work 4.00x) |" in text
    assert "| b | 1.70x vs offline (work 2.00x) | 3.00x vs offline (work 2.00x) |" in text
    assert "| **geometric mean** | **1.84x** | **2.45x** |" in text
    assert "- llama.cpp: skipped: not installed" in text
    assert "- vllm-offline: C=1 3/4, C=8 16/16" in text


def test_http_against_in_process_marks_cells_more_than_ten_percent_slower():
    text = render(_report())
    assert "| a | 1.00 | 1.00 |" in text
    assert "| b | 0.85 (under 0.90) | 1.00 |" in text
    assert "| **lowest** | 0.85 | |" in text
    rep = _report()
    del rep["engines"]["radixserve"]
    assert "HTTP / in process" not in render(rep)


def test_an_engine_started_anew_per_workload_keeps_what_it_measured_when_a_restart_fails(monkeypatch, tmp_path):
    import benchmarks.programs.run as run
    from benchmarks.programs.engines import Engine

    events: list[str] = []

    def start(name, a, model, hf_dir, logdir):
        n = sum(e.startswith("start") for e in events)
        events.append(f"start {n}")
        if n == 2:
            raise RuntimeError("the peer did not come back")
        return Engine(name, None, dict, lambda: None, lambda: events.append(f"close {n}"), fresh_per_workload=True)

    def bench_engine(eng, names, levels, seed, scale):
        events.append(f"bench {names}")
        return {w: {"cells": {}} for w in names}

    monkeypatch.setattr(run, "start", start)
    monkeypatch.setattr(run, "bench_engine", bench_engine)
    monkeypatch.setattr("radixserve.model.loader.resolve_hf_dir", lambda model: str(tmp_path))
    report = run.main(["--model", "m.gguf", "--engines", "llama.cpp", "--workloads", "mmlu,json_regex,rag_pipeline",
                       "--programs", "1:2"])
    assert events == ["start 0", "bench ['mmlu']", "close 0", "start 1", "bench ['json_regex']", "close 1", "start 2"]
    eng = report["engines"]["llama.cpp"]
    assert list(eng["workloads"]) == ["mmlu", "json_regex"] and "did not come back" in eng["stopped"]
