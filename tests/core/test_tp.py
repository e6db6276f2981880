"""Tensor parallelism on the CPU (gloo, ranks as processes on this machine), against tp=1 in fp32.

The oracle is the tp=1 path (itself checked against HF transformers in test_engine.py and
test_smollm2.py): greedy outputs token for token, prompt and output logprobs within 1e-4.
The tiny GQA models split unevenly: 6 query / 3 KV heads on 2 ranks (2 + 1 KV heads), and
4 / 1 (the KV head replicated); their vocabulary (49153) and MLP (131 columns) do not split
evenly either, and their LM head is untied.  Then the HTTP server with ``--tp-size 2``, and
two ``radixserve serve`` commands as two nodes on loopback: the same output, and killing
either node brings the other down with a non-zero exit (an in-flight request gets an error).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import httpx
import pytest
import torch

from tests.helpers.models import make_engine, random_prompts
from tests.helpers.tp_compare import assert_same
from tests.helpers.smol_prompts import core_prompts
from tests.helpers.server_harness import ServerHandle, _die_with_parent, free_port

GEN = {"max_new_tokens": 16, "temperature": 0}


def _tiny_gqa(path: str, smol_dir: str, heads: int, kv_heads: int, layers: int = 2) -> str:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(smol_dir)
    cfg = LlamaConfig(vocab_size=len(tok) + 1, hidden_size=16 * heads, intermediate_size=131, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=1024,
                      rms_norm_eps=1e-5, tie_word_embeddings=False, initializer_range=0.2,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).eval().save_pretrained(path)  # varied greedy outputs, top-2 gaps >> fp32 noise
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module", params=[(6, 3), (4, 1)], ids=["kv3-on-2", "kv1-replicated"])
def gqa_dir(request, tmp_path_factory, smol_dir) -> str:
    heads, kv = request.param
    return _tiny_gqa(str(tmp_path_factory.mktemp(f"gqa{heads}_{kv}")), smol_dir, heads, kv)


def _run(eng, prompts: list[list[int]], gen: dict = GEN) -> list[dict]:
    return eng.generate(input_ids=prompts, sampling_params=gen, return_logprob=True, logprob_start_len=0,
                        top_logprobs_num=3)


# ---------------------------------------------------------------- the layout (no processes)
@pytest.mark.parametrize("heads,kv,tp", [(4, 2, 2), (6, 3, 2), (4, 1, 2), (8, 2, 4), (9, 3, 4), (8, 8, 3)])
def test_layout_gives_every_head_to_a_rank_with_its_kv_head(heads, kv, tp):
    from radixserve.parallel.layout import TPLayout

    cfg = SimpleNamespace(num_attention_heads=heads, num_key_value_heads=kv, hidden_size=16 * heads,
                          intermediate_size=131, vocab_size=1001)
    layouts = [TPLayout.of(cfg, r, tp) for r in range(tp)]
    q_heads = [h for lay in layouts for h in range(lay.q_start, lay.q_start + lay.num_heads)]
    assert q_heads == list(range(heads))  # each query head exactly once, in order
    group = heads // kv
    for lay in layouts:
        assert lay.num_heads % lay.num_kv_heads == 0  # one group size per rank
        local = lay.num_heads // lay.num_kv_heads
        for j in range(lay.num_heads):  # the backend's mapping == the model's
            assert lay.kv_start + j // local == (lay.q_start + j) // group
    assert sum(lay.intermediate for lay in layouts) == 131
    assert all(lay.vocab_shard * tp >= 1001 for lay in layouts)


def test_layout_refuses_more_ranks_than_heads():
    from radixserve.parallel.layout import TPLayout

    cfg = SimpleNamespace(num_attention_heads=2, num_key_value_heads=1, hidden_size=32, intermediate_size=64,
                          vocab_size=100)
    with pytest.raises(ValueError, match="tp_size"):
        TPLayout.of(cfg, 0, 3)


@pytest.mark.parametrize("kw,field", [({"tp_size": 0}, "tp_size"), ({"tp_size": 2, "nnodes": 3}, "nnodes"),
                                      ({"tp_size": 2, "nnodes": 2}, "dist_init_addr"),
                                      ({"tp_size": 2, "nnodes": 2, "node_rank": 2, "dist_init_addr": "h:1"},
                                       "node_rank"),
                                      ({"tp_size": 2, "dist_init_addr": "nohost"}, "dist_init_addr")])
def test_bad_parallel_flags_name_the_flag(kw, field):
    from radixserve.config import EngineConfig

    with pytest.raises(ValueError, match=field):
        EngineConfig.from_kwargs(None, **kw)


def test_tp_refuses_quantization_naming_the_flag(tiny_dir):
    with pytest.raises(ValueError, match="quantization"):
        make_engine(tiny_dir, tp_size=2, quantization="int8")


# ---------------------------------------------------------------- Engine: tp=2 == tp=1
def test_engine_tp2_matches_tp1_on_uneven_gqa(gqa_dir):
    prompts = random_prompts(1, 6)  # every other one shares a 100-token prefix (cache hits)
    with make_engine(gqa_dir, quantization="none") as eng:
        ref = _run(eng, prompts)
    with make_engine(gqa_dir, quantization="none", tp_size=2, chunked_prefill_size=32) as eng:
        got = _run(eng, prompts)
        assert eng.info.num_slots == 8193
        eng.check_invariants()
    assert_same(ref, got)
    assert len({tuple(o["output_ids"]) for o in ref}) > 1  # not a degenerate model


@pytest.fixture(scope="module")
def smol_prompts(smol_dir) -> list[list[int]]:
    from transformers import AutoTokenizer

    return core_prompts(AutoTokenizer.from_pretrained(smol_dir))


@pytest.fixture(scope="module")
def smol_ref(smol_dir, smol_prompts) -> list[dict]:
    with make_engine(smol_dir, quantization="none") as eng:
        return _run(eng, smol_prompts, {"max_new_tokens": 24, "temperature": 0})


@pytest.mark.slow
def test_engine_tp2_matches_tp1_on_smollm2(smol_dir, smol_prompts, smol_ref):
    with make_engine(smol_dir, quantization="none", tp_size=2) as eng:
        got = _run(eng, smol_prompts, {"max_new_tokens": 24, "temperature": 0})
    assert_same(smol_ref, got)


# ---------------------------------------------------------------- HTTP server
@pytest.mark.slow
def test_server_tp2_matches_tp1_on_smollm2(smol_dir, smol_prompts, smol_ref):
    srv = ServerHandle(smol_dir, "--tp-size", "2", "--quantization", "none", "--max-total-tokens", "8192")
    try:
        srv.wait_ready()
        body = {"input_ids": smol_prompts, "sampling_params": {"max_new_tokens": 24, "temperature": 0},
                "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 3}
        with srv.client(timeout=120) as c:
            got = c.post("/generate", json=body).raise_for_status().json()
        assert_same(smol_ref, got)
    finally:
        srv.stop()


# ---------------------------------------------------------------- two nodes on loopback
def _node(model: str, rank: int, addr: str, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "radixserve.cli", "serve", "--model", model, "--dtype", "float32",
           "--dense-kernel", "plain", "--quantization", "none", "--tp-size", "2", "--nnodes", "2",
           "--node-rank", str(rank), "--dist-init-addr", addr, "--dist-timeout", "60", "--log-level", "warning",
           *extra]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_die_with_parent,
                            env=dict(os.environ, TOKENIZERS_PARALLELISM="false"))


def _two_nodes(model: str) -> tuple[ServerHandle, subprocess.Popen]:
    addr = f"127.0.0.1:{free_port()}"
    node0 = ServerHandle(model, "--quantization", "none", "--tp-size", "2", "--nnodes", "2", "--node-rank", "0",
                         "--dist-init-addr", addr, "--dist-timeout", "60", "--max-total-tokens", "8192")
    node1 = _node(model, 1, addr)
    try:
        node0.wait_ready(120)
    except BaseException:
        node1.kill()
        node0.stop()
        raise
    return node0, node1


def _exit_code(proc: subprocess.Popen, timeout: float) -> int:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"still running {timeout}s after its peer died")


def killing_node1_fails_node0(node0, node1, prompt: list[int]) -> None:
    """SIGKILL ``node1`` while a long request runs on ``node0``: node0 exits non-zero and the
    request ends without a 200."""
    inflight: dict = {}

    def long_request() -> None:
        try:
            with node0.client(timeout=60) as c:
                inflight["status"] = c.post("/generate", json={
                    "input_ids": prompt, "sampling_params": {"max_new_tokens": 900, "ignore_eos": True}
                }).status_code
        except httpx.HTTPError as e:
            inflight["status"] = type(e).__name__

    t = threading.Thread(target=long_request)
    t.start()
    time.sleep(1.0)
    node1.send_signal(signal.SIGKILL)
    assert _exit_code(node0.proc, 30) != 0
    t.join(30)
    assert not t.is_alive() and inflight["status"] != 200, inflight


@pytest.fixture(scope="module")
def gqa63_dir(tmp_path_factory, smol_dir) -> str:
    return _tiny_gqa(str(tmp_path_factory.mktemp("gqa63")), smol_dir, 6, 3)


def test_two_nodes_match_tp1_and_killing_node1_fails_node0(gqa63_dir):
    prompts = random_prompts(3, 4)
    with make_engine(gqa63_dir, quantization="none") as eng:
        ref = _run(eng, prompts)
    node0, node1 = _two_nodes(gqa63_dir)
    try:
        body = {"input_ids": prompts, "sampling_params": GEN, "return_logprob": True, "logprob_start_len": 0,
                "top_logprobs_num": 3}
        with node0.client() as c:
            assert_same(ref, c.post("/generate", json=body).raise_for_status().json())
        killing_node1_fails_node0(node0, node1, prompts[0])
    finally:
        node1.kill()
        node0.stop()


def test_node1_exits_nonzero_when_node0_dies(gqa63_dir):
    node0, node1 = _two_nodes(gqa63_dir)
    try:
        assert node1.poll() is None
        node0.proc.send_signal(signal.SIGKILL)  # the server process; its children die with it
        assert _exit_code(node1, 30) != 0
    finally:
        node1.kill()
        node0.stop()
