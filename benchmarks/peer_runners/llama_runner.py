"""bench_peers.py's llama.cpp peer (llama-cpp-python), run under llama.cpp's own Python:

    /work/peers/llama/bin/python benchmarks/peer_runners/llama_runner.py JOB.json OUT.json

The same GGUF file radixserve starts from (``job["model_gguf"]``), token ids fed directly,
greedy sampling (``temp=0``), EOS ignored (``Llama.generate`` never stops on its own).
One ``Llama`` object serves the requests one after another: it keeps the KV of the
previous sequence and reuses the longest common prefix with the next prompt, so a
group-major order of the shared-prefix prompts computes each system prompt once.
``cached_per_request`` is that reused length, read from the object's state before each
request (llama.cpp reports no hit rate itself).

Options (``job["options"]``): ``mode`` (``sequential``, the default, as above; ``batched``:
every request of a batch decoded together, see llama_batched.py), ``n_threads`` (default 2),
``n_batch`` / ``n_ubatch`` (tokens per decode call, default 512), ``flash_attn`` (default True:
the same speed sequentially, 1.44x on the batched shared-prefix workload, 712 vs 495 tok/s).
"""
from __future__ import annotations

from typing import Any

from common import batches, longest_request, reused_prefix, runner_main


class LlamaCppPeer:
    """Sequential requests on one ``llama_cpp.Llama``."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm

    def generate_one(self, prompt: list[int], n: int) -> list[int]:
        out: list[int] = []
        for tok in self.llm.generate(prompt, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
            out.append(int(tok))
            if len(out) == n:
                break
        return out

    def run_batch(self, prompts: list[list[int]], output_lens: list[int]) -> dict[str, Any]:
        outputs, cached = [], []
        for prompt, n in zip(prompts, output_lens):
            cached.append(reused_prefix(list(self.llm._input_ids), prompt))
            outputs.append(self.generate_one(prompt, n))
        return {"outputs": outputs, "cached_per_request": cached}

    def reset_cache(self) -> None:
        self.llm.reset()
        self.llm._ctx.kv_cache_clear()


def make_peer(job: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    import llama_cpp

    opts = job.get("options", {})
    cfg = {"mode": opts.get("mode", "sequential"), "n_threads": int(opts.get("n_threads", 2)),
           "n_batch": int(opts.get("n_batch", 512)), "n_ubatch": int(opts.get("n_ubatch", opts.get("n_batch", 512))),
           "flash_attn": bool(opts.get("flash_attn", True))}
    info = {"peer": "llama.cpp", "version": llama_cpp.__version__,
            "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(), **cfg}
    if cfg["mode"] == "batched":
        from llama_batched import LlamaBatchedPeer, plan_prefill

        cells = [len(plan_prefill(p)[0]) + sum(n) for p, n in batches(job)]
        n_ctx = max(cells + [1024]) + 256
        n_seq = max([len(p) for p, _ in batches(job)] + [len(job.get("warmup") or [])] + [1])
        info.update(n_ctx=n_ctx, n_seq_max=n_seq, kv_unified=True)
        return LlamaBatchedPeer(llama_cpp, job["model_gguf"], n_ctx, n_seq, cfg), info
    if cfg["mode"] != "sequential":
        raise ValueError(f"llama.cpp mode {cfg['mode']!r}: sequential or batched")
    n_ctx = max(longest_request(job), 512) + 64
    llm = llama_cpp.Llama(model_path=job["model_gguf"], verbose=False, seed=0, n_ctx=n_ctx,
                          n_threads=cfg["n_threads"], n_threads_batch=cfg["n_threads"], n_batch=cfg["n_batch"],
                          n_ubatch=cfg["n_ubatch"], flash_attn=cfg["flash_attn"])
    info["n_ctx"] = n_ctx
    return LlamaCppPeer(llm), info


if __name__ == "__main__":
    runner_main(make_peer)
