"""How much of radixserve's model time attention takes at a given context (bench_scale.py).

The C++ layer stack runs every layer of a step in one native call, so attention cannot be
timed inside it.  The probe turns the stack off for its own run (``layer_stack.run`` returns
None, so ``layer_loop.run_layers`` makes the same kernel calls from Python) and times, per
model step, each layer's ``attend`` call (the backend's ``step_attention``) against the whole
``final_hidden`` (every layer, norms, MLPs; the LM head is left out).  A step's share is its
attention seconds / its layer seconds; reported separately for prefill chunks (steps with
more tokens than requests) and decode steps.  The Python loop adds its dispatch to the
layers' time, so the shares are slightly low at small steps.

The probe run: one document of ``context`` tokens, then ``questions`` prompts of that document
plus ``question_len`` own tokens, ``output_len`` greedy tokens each, in one ``generate`` call
(the first prompt computes the document, the others reuse it from the radix cache).
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np


@contextmanager
def timed_attention(engine: Any) -> Iterator[list[tuple[int, int, float, float]]]:
    """Record (tokens, requests, attention s, layers s) of every model step while inside."""
    from radixserve.model.cpu import layer_stack

    runner = engine.runner
    model, backend = runner.model, runner.backend
    steps: list[tuple[int, int, float, float]] = []
    orig_run, orig_step, orig_hidden = layer_stack.run, backend.step_attention, model.final_hidden
    spent = [0.0]

    def step_attention(batch: Any, num_heads: int) -> Any:
        attend = orig_step(batch, num_heads)

        def timed(q: Any, layer_id: int, scaling: float) -> Any:
            t0 = time.perf_counter()
            out = attend(q, layer_id, scaling)
            spent[0] += time.perf_counter() - t0
            return out

        return timed

    def final_hidden(batch: Any, be: Any, rows: Any) -> Any:
        spent[0] = 0.0
        t0 = time.perf_counter()
        out = orig_hidden(batch, be, rows)
        steps.append((int(batch.input_ids.numel()), int(len(rows)), spent[0], time.perf_counter() - t0))
        return out

    layer_stack.run = lambda *a, **k: None
    backend.step_attention, model.final_hidden = step_attention, final_hidden
    try:
        yield steps
    finally:
        layer_stack.run = orig_run
        del backend.step_attention, model.final_hidden


def attention_share(engine: Any, context: int, vocab: int, questions: int = 4, question_len: int = 64,
                    output_len: int = 16, seed: int = 7) -> dict[str, Any]:
    """The probe of the module docstring; the engine's cache is flushed before and after."""
    rng = np.random.default_rng(seed)
    doc = rng.integers(100, vocab - 100, context).tolist()
    prompts = [doc + rng.integers(100, vocab - 100, question_len).tolist() for _ in range(questions)]
    params = [{"max_new_tokens": output_len, "ignore_eos": True, "temperature": 0}] * questions
    engine.flush_cache()
    with timed_attention(engine) as steps:
        engine.generate(input_ids=prompts, sampling_params=params)
    engine.flush_cache()
    out: dict[str, Any] = {"context": context, "questions": questions, "steps": len(steps)}
    for kind, pick in (("prefill", lambda t, r: t > r), ("decode", lambda t, r: t == r)):
        chosen = [s for s in steps if pick(s[0], s[1])]
        attn, total = sum(s[2] for s in chosen), sum(s[3] for s in chosen)
        out[kind] = {"steps": len(chosen), "tokens": sum(s[0] for s in chosen), "attention_s": attn,
                     "layers_s": total, "share": attn / total if total else None}
    return out
