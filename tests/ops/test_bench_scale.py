"""benchmarks/bench_scale.py's parts: the shapes are those of the published models, a random
GGUF reads back through radixserve's converter as the values written, the workloads share
their documents, named batch workloads run in order, and the report's ratios and comparisons."""
from __future__ import annotations

import argparse

import numpy as np

from benchmarks.bench_scale import build_job, subset
from benchmarks.peer_runners.common import batch_names, run_job
from benchmarks.scale_models import SHAPES, Shape, hf_shapes, param_count, random_tensor, write_random_gguf
from benchmarks.scale_report import compare, table


def test_shapes_have_the_published_parameter_counts() -> None:
    assert param_count(SHAPES["1.5b"].config()) == 1_543_714_304  # Qwen2.5-1.5B (tied, q/k/v biases)
    assert param_count(SHAPES["8b"].config()) == 8_030_261_248  # Llama-3-8B
    assert 0.30e9 < param_count(SHAPES["0.3b"].config()) < 0.33e9
    cfg = SHAPES["1.5b"].config()
    assert (cfg.model_type, cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads) == ("qwen2", 2, 128)


def test_random_gguf_reads_back_as_written(tmp_path) -> None:
    from safetensors.torch import load_file

    from radixserve.model.loader import load_config, resolve_hf_dir

    tiny = Shape("tiny", "test", "qwen2", dict(vocab_size=49280, hidden_size=64, intermediate_size=128,
                                                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                                 tie_word_embeddings=True))
    path = write_random_gguf(tiny, str(tmp_path / "tiny.Q8_0.gguf"), "Q8_0", seed=3)
    hf_dir = resolve_hf_dir(path)
    cfg = load_config(hf_dir)
    assert (cfg.model_type, cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers) == ("qwen2", 49280, 64, 2)
    got = load_file(f"{hf_dir}/model.safetensors")
    rng = np.random.default_rng(3)
    expected = {n: random_tensor(n, s, rng) for n, s in hf_shapes(tiny.config()).items()}
    assert set(got) == set(expected)
    for name, want in expected.items():  # Q8_0: within half a step of each block's scale
        err = np.abs(got[name].float().numpy() - want).max()
        assert err <= np.abs(want).max() / 127 + 1e-6, name
    assert np.abs(expected["model.embed_tokens.weight"]).max() > 0 and expected["model.norm.weight"].min() == 1


def args(**kw) -> argparse.Namespace:
    base = dict(seed=0, workloads={"single", "docs"}, contexts=[512, 2048], single_repeats=1, sharegpt_n=0,
                sharegpt_max_output=8, docs_plan={512: (2, 3, 4), 2048: (1, 2, 5)})
    return argparse.Namespace(**{**base, **kw})


def test_docs_workloads_share_each_document() -> None:
    job = build_job(args(), vocab=1000, tokenizer=None)
    assert job["batch_order"] == ["docs_512", "docs_2048"]
    docs = job["docs_512"]["prompts"]
    assert len(docs) == 6 and all(len(p) == 512 + 64 for p in docs)
    assert docs[0][:512] == docs[2][:512] and docs[3][:512] != docs[0][:512]
    assert docs[0][512:] != docs[1][512:]
    assert job["docs_2048"]["output_lens"] == [5, 5]
    assert len(job["single"]["prompts"]) == 3
    small = subset(job, {"single"})
    assert set(small) == {"single", "warmup", "batch_order"} and small["batch_order"] == []


class Recorder:
    def __init__(self) -> None:
        self.ran: list[int] = []

    def generate_one(self, prompt: list[int], n: int) -> list[int]:
        return [0] * n

    def run_batch(self, prompts: list[list[int]], output_lens: list[int]) -> dict:
        self.ran.append(len(prompts))
        return {"outputs": [[0] * n for n in output_lens]}

    def reset_cache(self) -> None:
        pass


def test_named_batch_workloads_run_in_their_order() -> None:
    job = {"batch_order": ["b", "a", "missing"], "a": {"prompts": [[1]], "output_lens": [1]},
           "b": {"prompts": [[1], [2]], "output_lens": [1, 1]}}
    assert batch_names(job) == ["b", "a"]
    peer = Recorder()
    assert list(run_job(peer, job, log=lambda s: None)) == ["b", "a"]
    assert peer.ran == [2, 1]
    assert batch_names({"sharegpt": {"prompts": [[1]], "output_lens": [1]}}) == ["sharegpt"]  # the default order


def report(ours: float, llama: float, vllm: float) -> dict:
    res = {"radixserve": {"docs_512": {"total_tok_s": ours}}, "llama.cpp Q4_1 bat": {"docs_512": {"total_tok_s": llama}},
           "vLLM bf16": {"docs_512": {"total_tok_s": vllm}}}
    return {"shapes": {"0.3b": {"results": res, "requests": {"docs_512": {}}, "params": 3e8, "like": "x"}}}


def test_table_ratio_is_against_the_best_other_peer() -> None:
    text = table([report(1200.0, 500.0, 1000.0)])
    row = next(line for line in text.splitlines() if "docs_512" in line)
    assert row.endswith("| 1.20x |") and "1,200.0" in row
    assert "| 1.100x |" in compare(report(1000.0, 1.0, 1.0), report(1100.0, 1.0, 1.0))

