"""Pipeline parallelism on the CPU (gloo, stages as processes on this machine), against one process in fp32.

The oracle is the one-process path (as in test_tp.py): greedy outputs token for token, prompt
and output logprobs and top-3 alternatives within 1e-4, and seeded sampling token for token.
The model has 3 layers (2 + 1 on two stages), an odd vocabulary and MLP width, and an untied
head, through the Engine; the tied tiny model through the HTTP server with ``--pp-size 2`` (the
last stage holds the embedding its head is tied to).  Then two
``radixserve serve`` commands as two nodes on loopback, ``--pp-size 2 --tp-size 2`` (stage 0 on
node 0, stage 1 on node 1, four ranks): the same output over HTTP, and killing node 1 (the last
stage) ends node 0 non-zero with an error for the in-flight request.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from tests.core.test_tp import GEN, _run, _tiny_gqa, killing_node1_fails_node0
from tests.helpers.models import make_engine, random_prompts
from tests.helpers.server_harness import ServerHandle, free_port
from tests.helpers.tp_compare import assert_same

SEEDED = {"max_new_tokens": 8, "temperature": 0.9, "top_p": 0.95, "sampling_seed": 7}


# ---------------------------------------------------------------- the split (no processes)
@pytest.mark.parametrize("layers,stages,want", [(3, 2, [(0, 2), (2, 1)]), (30, 4, [(0, 8), (8, 8), (16, 7), (23, 7)]),
                                                 (2, 2, [(0, 1), (1, 1)])])
def test_stages_split_layers_contiguously(layers, stages, want):
    from radixserve.parallel.stage import PipeStage

    got = [PipeStage.of(i, stages, layers) for i in range(stages)]
    assert [(s.first, s.num_layers) for s in got] == want
    last = got[-1]
    assert last.param_name(f"layers.{last.first}.mlp.down_proj.weight", False) == "layers.0.mlp.down_proj.weight"
    assert got[0].param_name(f"layers.{last.first}.mlp.down_proj.weight", False) is None
    assert got[0].param_name("embed_tokens.weight", True) and last.param_name("embed_tokens.weight", True)
    assert last.param_name("embed_tokens.weight", False) is None and got[0].param_name("norm.weight", False) is None


def test_micro_batches_keep_requests_whole_and_in_order():
    from radixserve.ipc.worker_link import StepPlan
    from radixserve.worker.pp.micro import split_plan

    reqs = [SimpleNamespace(input_ids=np.zeros(n)) for n in (100, 1, 1, 1, 50)]
    plan = StepPlan(False, reqs, release=["gone"])
    for parts in (1, 2, 3, 5, 9):
        got = split_plan(plan, parts)
        assert [r for p in got for r in p.reqs] == reqs and len(got) == min(parts, 5)
        assert all(p.reqs for p in got) and got[0].release == ["gone"] and all(not p.release for p in got[1:])
    assert [len(p.reqs) for p in split_plan(plan, 2)] == [1, 4]  # balanced by tokens
    assert split_plan(StepPlan(True, [], ["x"]), 4)[0].release == ["x"]


@pytest.mark.parametrize("kw,field", [({"pp_size": 0}, "pp_size"), ({"pp_micro_batches": -1}, "pp_micro_batches"),
                                      ({"pp_size": 2, "tp_size": 2, "nnodes": 3, "dist_init_addr": "h:1"}, "nnodes")])
def test_bad_pipeline_flags_name_the_flag(kw, field):
    from radixserve.config import EngineConfig

    with pytest.raises(ValueError, match=field):
        EngineConfig.from_kwargs(None, **kw)


@pytest.mark.parametrize("kw,field", [({"pp_size": 3}, "pp_size"),
                                      ({"pp_size": 2, "quantization": "int8"}, "quantization"),
                                      ({"pp_size": 2, "kv_cache_dtype": "int8"}, "kv_cache_dtype"),
                                      ({"pp_size": 2, "speculative_algorithm": "draft"}, "speculative_algorithm")])
def test_pipeline_refusals_name_the_flag(tiny_dir, kw, field):
    from radixserve.config import EngineConfig
    from radixserve.worker.build import check_config

    with pytest.raises(ValueError, match=field):  # before any process starts
        check_config(EngineConfig.from_kwargs(tiny_dir, **kw))


# ---------------------------------------------------------------- Engine: pp=2 (x tp=2) == one process
@pytest.fixture(scope="module")
def gqa3_dir(tmp_path_factory, smol_dir) -> str:
    return _tiny_gqa(str(tmp_path_factory.mktemp("gqa63_3layers")), smol_dir, 6, 3, layers=3)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return random_prompts(5, 5)  # every other one shares a prefix (cache hits)


@pytest.fixture(scope="module")
def ref(gqa3_dir, prompts) -> tuple[list[dict], list[list[int]]]:
    with make_engine(gqa3_dir, quantization="none") as eng:
        greedy = _run(eng, prompts)
        seeded = [o["output_ids"] for o in eng.generate(input_ids=prompts, sampling_params=SEEDED)]
    assert len({tuple(o["output_ids"]) for o in greedy}) > 1  # not a degenerate model
    return greedy, seeded


@pytest.mark.parametrize("kw", [{"pp_size": 2}, {"pp_size": 2, "tp_size": 2, "pp_micro_batches": 3}],
                         ids=["pp2", "pp2xtp2"])
def test_engine_pipeline_matches_one_process(gqa3_dir, prompts, ref, kw):
    with make_engine(gqa3_dir, quantization="none", chunked_prefill_size=32, **kw) as eng:
        got = _run(eng, prompts)
        seeded = [o["output_ids"] for o in eng.generate(input_ids=prompts, sampling_params=SEEDED)]
        assert eng.info.num_slots == 8193
        eng.check_invariants()
    assert_same(ref[0], got)
    assert seeded == ref[1]


def test_server_pp2_matches_one_process_with_a_tied_head(tiny_dir):
    prompts, gen = random_prompts(6, 3), {"max_new_tokens": 6, "temperature": 0}
    with make_engine(tiny_dir, quantization="none") as eng:
        want = _run(eng, prompts, gen)
    srv = ServerHandle(tiny_dir, "--pp-size", "2", "--quantization", "none", "--max-total-tokens", "8192")
    try:
        srv.wait_ready(120)
        body = {"input_ids": prompts, "sampling_params": gen, "return_logprob": True, "logprob_start_len": 0,
                "top_logprobs_num": 3}
        with srv.client(timeout=60) as c:
            assert_same(want, c.post("/generate", json=body).raise_for_status().json())
    finally:
        srv.stop()


# ---------------------------------------------------------------- two nodes on loopback, HTTP, a dead stage
def test_two_nodes_pp2xtp2_match_and_killing_the_last_stage_fails_node0(gqa3_dir, prompts, ref):
    from tests.core.test_tp import _node

    addr = f"127.0.0.1:{free_port()}"
    par = ("--quantization", "none", "--pp-size", "2", "--tp-size", "2", "--nnodes", "2", "--dist-init-addr", addr,
           "--dist-timeout", "60")
    node0 = ServerHandle(gqa3_dir, *par, "--node-rank", "0", "--max-total-tokens", "8192")
    node1 = _node(gqa3_dir, 1, addr, "--pp-size", "2")
    try:
        node0.wait_ready(120)
        body = {"input_ids": prompts, "sampling_params": GEN, "return_logprob": True, "logprob_start_len": 0,
                "top_logprobs_num": 3}
        with node0.client() as c:
            assert_same(ref[0], c.post("/generate", json=body).raise_for_status().json())
        killing_node1_fails_node0(node0, node1, prompts[0])
    finally:
        node1.kill()
        node0.stop()
