"""Greedy agreement of bf16 and of ``--dtype auto`` with fp32, for every model family.

Each family of ``tests/helpers/families.FAMILIES`` (tiny random checkpoints with the family's
features: windows, soft-capping, q/k norms, partial rotary, ...) is served three times by the
Engine: fp32 (the exact path, equal to transformers), bf16, and ``dtype="auto"`` with every
other option at its default (the runtime's own numerics choice on this machine, shown in the
table).  Over ``--prompts`` random prompts (4 to 120 tokens, some longer than the window) x
``--tokens`` greedy tokens:

* prefix: identical tokens before the first divergence from fp32, as a share of all tokens
  (greedy decoding conditions on its own output, so a divergence changes what follows);
* overall: positions whose token equals fp32's;
* same: prompts whose whole output equals fp32's;
* gap: the median fp32 margin between the top two logprobs of the generated tokens: the
  tiny random models' only source of robustness (a tied LM head is the x40-sharpened
  embedding, an untied one is not, so untied families flip more under bf16).

    .venv/bin/python -m benchmarks.family_agreement                 # every family, 20 x 32
    .venv/bin/python -m benchmarks.family_agreement --families qwen3 gemma2 --json out.json
"""
from __future__ import annotations

import argparse
import random
import statistics
import tempfile
from typing import Any

from benchmarks.bench_speculative import cpu_model
from benchmarks.report import write_json
from tests.helpers.families import FAMILIES, build_family

MODES = ("bfloat16", "auto")


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(200, 40000) for _ in range(rng.randrange(4, 121))] for _ in range(n)]


def greedy(path: str, dtype: str, ids: list[list[int]], tokens: int) -> tuple[list[list[int]], str, float]:
    """Greedy outputs, the numerics the Engine ran them with and the median top-2 logprob gap.
    fp32 and bf16 pin the plain dense kernel and no quantization; "auto" leaves every choice to
    the runtime."""
    from radixserve import Engine

    kw: dict[str, Any] = {} if dtype == "auto" else {"dense_kernel": "plain", "quantization": "none"}
    with Engine(path, dtype=dtype, max_total_tokens=8192, **kw) as eng:
        outs = eng.generate(input_ids=ids, sampling_params={"max_new_tokens": tokens, "temperature": 0,
                                                           "ignore_eos": True}, return_logprob=True,
                            top_logprobs_num=2)
        gaps = [top[0][0] - top[1][0] for o in outs for top in o["meta_info"]["output_top_logprobs"]]
        return [o["output_ids"] for o in outs], eng.runner.numerics.describe(), statistics.median(gaps)


def agreement(ref: list[list[int]], got: list[list[int]]) -> dict[str, float]:
    total = sum(len(r) for r in ref)
    prefix = same = 0
    for r, g in zip(ref, got, strict=True):
        k = next((i for i, (a, b) in enumerate(zip(r, g)) if a != b), min(len(r), len(g)))
        prefix += k
        same += r == g
    overall = sum(a == b for r, g in zip(ref, got) for a, b in zip(r, g))
    return {"prefix": prefix / total, "overall": overall / total, "same": same / len(ref)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", nargs="*", default=sorted(FAMILIES))
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()

    from radixserve.model.loader import resolve_hf_dir

    smol_dir, ids = resolve_hf_dir(None), prompts(args.prompts)
    rows: list[dict[str, Any]] = []
    for name in args.families:
        with tempfile.TemporaryDirectory() as path:
            build_family(name, path, smol_dir)
            ref, _, gap = greedy(path, "float32", ids, args.tokens)
            for mode in MODES:
                out, numerics, _ = greedy(path, mode, ids, args.tokens)
                rows.append({"family": name, "dtype": mode, "numerics": numerics, "gap": gap,
                             **agreement(ref, out)})
    cpu = cpu_model()
    print(f"\ngreedy agreement with fp32: {args.prompts} prompts x {args.tokens} tokens, CPU: {cpu}")
    print(f"{'family':<16}{'dtype':<10}{'ran as':<34}{'prefix':>8}{'overall':>9}{'same':>7}{'gap':>7}")
    for r in rows:
        print(f"{r['family']:<16}{r['dtype']:<10}{r['numerics']:<34}{r['prefix']:>8.1%}{r['overall']:>9.1%}"
              f"{r['same']:>7.0%}{r['gap']:>7.2f}")
    write_json(args.json, {"cpu": cpu, "prompts": args.prompts, "tokens": args.tokens, "rows": rows})


if __name__ == "__main__":
    main()
