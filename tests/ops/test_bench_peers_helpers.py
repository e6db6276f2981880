"""The pure helpers of benchmarks/bench_peers.py: FLOP counting, KV pool sizing, ``key=value``
options, llama.cpp's reused prefix and the single-stream timing protocol."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from benchmarks.bench_peers import parse_kv, pool_tokens
from benchmarks.peer_runners.common import batch_workload, reused_prefix, single_stream
from benchmarks.roofline import decode_step_bytes, layer_params, run_flops, weight_params

# SmolLM2-135M's shapes
CFG = SimpleNamespace(hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3,
                      head_dim=64, num_hidden_layers=30, vocab_size=49152)


def test_layer_and_weight_params_match_smollm2() -> None:
    assert layer_params(CFG) == 576 * (576 + 2 * 192) + 576 * 576 + 576 * 3072 + 1536 * 576
    # 134.5M: the tied embedding counted once, as the LM head
    assert weight_params(CFG) == 30 * (layer_params(CFG) + 2 * 576) + 576 + 576 * 49152


def test_run_flops_counts_uncached_prompt_and_decode_passes() -> None:
    f = run_flops(CFG, [(10, 4, 3)])  # positions 4..9 of the prompt, then 2 decode passes (10, 11)
    assert f["token_passes"] == 6 + 2
    assert f["sampled_rows"] == 3
    assert f["attended_keys"] == sum(pos + 1 for pos in range(4, 12))
    assert f["linear_flop"] == 2 * 30 * layer_params(CFG) * 8
    assert f["lm_head_flop"] == 2 * 576 * 49152 * 3
    assert f["attention_flop"] == 4 * 30 * 9 * 64 * f["attended_keys"]
    assert f["total_flop"] == f["linear_flop"] + f["lm_head_flop"] + f["attention_flop"]


def test_decode_step_bytes_adds_kv_of_the_context() -> None:
    assert decode_step_bytes(CFG, 1000, 2, 10) == 1000 + 2 * 30 * 3 * 64 * 10 * 2


def test_pool_tokens_counts_shared_prefixes_once() -> None:
    job = {"shared_prefix": {"prompts": [[1, 2, 3, 4], [1, 2, 3, 5], [9, 9]], "output_lens": [2, 2, 2]}}
    assert pool_tokens(job, shared=False) == int((10 + 6) * 1.1) + 1024
    assert pool_tokens(job, shared=True) == int((10 + 6 - 3) * 1.1) + 1024


def test_parse_kv_reads_json_values_else_strings() -> None:
    assert parse_kv(["max_total_tokens=4096", "disable-radix-cache=true", "quantization=int8", "x=null"]) == {
        "max_total_tokens": 4096, "disable_radix_cache": True, "quantization": "int8", "x": None}
    with pytest.raises(ValueError):
        parse_kv(["novalue"])


def test_reused_prefix_replays_the_last_token_of_a_fully_cached_prompt() -> None:
    assert reused_prefix([1, 2, 3, 4], [1, 2, 9]) == 2
    assert reused_prefix([1, 2, 3, 4], [1, 2, 3]) == 2
    assert reused_prefix([], [1, 2]) == 0


class FakePeer:
    """n tokens of ``7``; remembers the calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []
        self.resets = 0

    def generate_one(self, prompt: list[int], n: int) -> list[int]:
        self.calls.append((prompt[0], n))
        return [7] * n

    def run_batch(self, prompts: list[list[int]], output_lens: list[int]) -> dict:
        return {"outputs": [[7] * n for n in output_lens], "cached_per_request": [1] * len(prompts)}

    def reset_cache(self) -> None:
        self.resets += 1


def test_single_stream_uses_a_fresh_prompt_for_every_run() -> None:
    peer = FakePeer()
    res = single_stream(peer, [[i] for i in range(5)], 8)
    assert peer.calls == [(0, 8), (1, 1), (2, 1), (3, 8), (4, 8)]
    assert res["repeats"] == 2 and res["output_len"] == 8 and res["decode_tok_s"] > 0


def test_batch_workload_rates_and_hit_rate() -> None:
    peer = FakePeer()
    res = batch_workload(peer, [[1, 2, 3], [4, 5]], [2, 4])
    assert peer.resets == 1
    assert (res["prompt_tokens"], res["completion_tokens"], res["cached_tokens"]) == (5, 6, 2)
    assert res["hit_rate"] == pytest.approx(0.4)
    assert res["total_tok_s"] == pytest.approx(11 / res["time_s"])


# ---------------------------------------------------------------- where the peers' Pythons are


def test_the_peer_pythons_come_from_the_flag_then_the_env_var_then_the_default(monkeypatch) -> None:
    from benchmarks.peer_procs import LLAMA, VLLM, peer_python

    for spec, var in ((LLAMA, "BENCH_LLAMA_PYTHON"), (VLLM, "BENCH_VLLM_PYTHON")):
        assert spec.env_var == var
        monkeypatch.delenv(var, raising=False)
        assert peer_python(spec) == spec.default_python
        monkeypatch.setenv(var, "/somewhere/bin/python")
        assert peer_python(spec) == "/somewhere/bin/python"
        assert peer_python(spec, "/given/bin/python") == "/given/bin/python"


def test_find_python_honours_the_env_var_and_skips_a_missing_peer_saying_how(monkeypatch, tmp_path) -> None:
    """A Python named by the env var is used when it imports the peer's module; a missing one is
    skipped with the install commands for that venv (vllm/libs made before tcmalloc is copied)."""
    import sys
    from dataclasses import replace

    from benchmarks.peer_procs import VLLM, find_python

    importable = replace(VLLM, module="json")  # what every Python can import
    monkeypatch.setenv("BENCH_VLLM_PYTHON", sys.executable)
    assert find_python(importable, None) == (sys.executable, "")
    missing = str(tmp_path / "vllm-venv" / "bin" / "python")
    monkeypatch.setenv("BENCH_VLLM_PYTHON", missing)
    python, why = find_python(VLLM, None)
    assert python is None and missing in why and "$BENCH_VLLM_PYTHON" in why
    assert why.index("mkdir -p") < why.index("libtcmalloc_minimal.so.4 ")
    assert f"python3 -m venv {tmp_path / 'vllm-venv'} " in why
