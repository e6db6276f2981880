"""vLLM's offline ``LLM`` API as a peer of the programs suite, run under vLLM's own Python:

    $BENCH_VLLM_PYTHON benchmarks/peer_runners/vllm_programs.py HF_DIR PORT AUTHKEY_HEX [JSON_OPTIONS]

Loads ``LLM(model=HF_DIR, enable_prefix_caching=True, ...)`` in this process and answers
batches over a ``multiprocessing.connection`` socket on 127.0.0.1:PORT: every request of a
batch goes into ONE ``LLM.generate`` call, which is how an offline-API user gets batching.
The programs themselves run in radixserve's Python (``benchmarks/programs/offline_backend.py``
gathers the calls of concurrent programs into those batches).

Messages (pickled tuples): ``("batch", [req, ...])`` -> list of results, a request being
``{"kind": "gen" | "logprobs", "prompt": str | list[int], "params": {...}}``;
``("stats",)`` -> counters; ``("reset",)`` -> prefix cache emptied; ``("quit",)``.
Counters, from vLLM's own outputs: ``prompt_tokens``, ``cached_tokens`` (``num_cached_tokens``),
``generation_tokens``, ``requests``, ``batches``.  Standard library and vLLM only.
"""
from __future__ import annotations

import json
import sys
from multiprocessing.connection import Listener
from typing import Any

from vllm_runner import reexec_with_preload_for  # this script's folder is on sys.path (run as a script)


def sampling(kind: str, params: dict[str, Any]) -> Any:
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    if kind == "logprobs":
        return SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
    kw: dict[str, Any] = {"temperature": params.get("temperature", 1.0),
                          "max_tokens": params.get("max_tokens", 128)}
    for name in ("top_p", "top_k", "stop", "seed", "ignore_eos"):
        if params.get(name) is not None:
            kw[name] = params[name]
    if params.get("regex") is not None:
        kw["structured_outputs"] = StructuredOutputsParams(regex=params["regex"])
    elif params.get("json") is not None:
        kw["structured_outputs"] = StructuredOutputsParams(json=params["json"])
    return SamplingParams(**kw)


def result(kind: str, out: Any) -> dict[str, Any]:
    comp = out.outputs[0]
    res: dict[str, Any] = {"text": comp.text, "finish_reason": comp.finish_reason,
                           "prompt_tokens": len(out.prompt_token_ids), "cached_tokens": out.num_cached_tokens or 0,
                           "completion_tokens": len(comp.token_ids)}
    if kind == "logprobs":
        res["prompt_logprobs"] = [None if d is None else float(d[tid].logprob)
                                  for d, tid in zip(out.prompt_logprobs, out.prompt_token_ids)]
        res["completion_tokens"] = 0  # the 1 token vLLM insists on is not part of the program
    return res


def serve(llm: Any, listener: Listener) -> None:
    from vllm.inputs import TokensPrompt

    counters = dict.fromkeys(("prompt_tokens", "cached_tokens", "generation_tokens", "requests", "batches"), 0)
    with listener.accept() as conn:
        print("vllm_programs: ready", flush=True)
        while True:
            msg = conn.recv()
            if msg[0] == "quit":
                conn.send("bye")
                return
            if msg[0] == "stats":
                conn.send(dict(counters))
                continue
            if msg[0] == "reset":
                conn.send(bool(llm.reset_prefix_cache()))
                continue
            reqs = msg[1]
            try:
                prompts = [r["prompt"] if isinstance(r["prompt"], str) else TokensPrompt(prompt_token_ids=r["prompt"])
                           for r in reqs]
                outs = llm.generate(prompts, [sampling(r["kind"], r["params"]) for r in reqs], use_tqdm=False)
                answer = [result(r["kind"], o) for r, o in zip(reqs, outs)]
            except Exception as e:  # reported to the caller, which raises it in the program
                conn.send({"error": f"{type(e).__name__}: {e}"})
                continue
            counters["batches"] += 1
            for r, a in zip(reqs, answer):
                counters["requests"] += 1
                counters["prompt_tokens"] += a["prompt_tokens"]
                counters["cached_tokens"] += a["cached_tokens"]
                counters["generation_tokens"] += a["completion_tokens"]
            conn.send(answer)


def main() -> None:
    hf_dir, port, authkey = sys.argv[1], int(sys.argv[2]), bytes.fromhex(sys.argv[3])
    options = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
    reexec_with_preload_for(options.get("omp", "iomp"))
    from vllm import LLM

    llm = LLM(model=hf_dir, dtype=options.get("dtype", "bfloat16"), enable_prefix_caching=True,
              max_model_len=options.get("max_model_len", 4096), seed=0, **options.get("llm_kwargs", {}))
    with Listener(("127.0.0.1", port), authkey=authkey) as listener:
        serve(llm, listener)


if __name__ == "__main__":
    main()
