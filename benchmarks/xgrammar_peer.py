"""XGrammar as a peer of ``bench_jsonschemabench.py`` (never a dependency of radixserve).

Coverage and compile time: ``xgrammar.GrammarCompiler.compile_json_schema`` with SmolLM2's
tokenizer (``strict_mode`` on: extra properties banned, as radixserve closes objects), one schema
at a time, nothing cached (a new compiler per schema).  Generation: the same model in Hugging Face
transformers (fp32), greedy, each row masked by its schema's ``GrammarMatcher`` bitmask
(``xgrammar.apply_token_bitmask_inplace``), batched ``--xgrammar-batch`` rows at a time with left
padding, until EOS or ``max_new_tokens``; the prompts are ``bench_jsonschemabench.prompt_of``'s.

Install where the benchmark runs, without its torch pin moving (``benchmarks/README.md``):
``pip install --no-deps --target /work/peers/xgrammar-lib xgrammar apache-tvm-ffi`` and run with
``PYTHONPATH=/work/peers/xgrammar-lib``.  Without it ``available()`` says why and the benchmark skips
the peer.
"""
from __future__ import annotations

import json
import time
from typing import Any, Optional


def available() -> Optional[str]:
    """None when xgrammar imports, else the reason it does not."""
    try:
        import xgrammar  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure skips the peer
        return f"xgrammar is not installed here ({type(e).__name__}: {e})"
    return None


def run_xgrammar(items: list, args: Any, prompt_of, validates, subsets: list[str]) -> dict:
    import torch
    import xgrammar as xgr
    from transformers import AutoTokenizer, LlamaForCausalLM

    from radixserve.model.loader import resolve_hf_dir

    hf_dir = resolve_hf_dir(args.model)
    tok = AutoTokenizer.from_pretrained(hf_dir)
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok))
    comp: list[tuple[Optional[float], Optional[str]]] = []
    grammars: dict[int, Any] = {}
    t0 = time.perf_counter()
    for i, (_, _, schema) in enumerate(items):
        compiler = xgr.GrammarCompiler(info, cache_enabled=False)
        t = time.perf_counter()
        try:
            grammars[i] = compiler.compile_json_schema(json.dumps(schema), strict_mode=True)
            comp.append((time.perf_counter() - t, None))
        except Exception as e:  # noqa: BLE001 - a refusal of the peer is a miss, whatever it raises
            comp.append((None, f"{type(e).__name__}: {e}"[:300]))
    compile_wall = time.perf_counter() - t0
    model = LlamaForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    ok = sorted(grammars)
    outs: dict[int, tuple[str, bool]] = {}
    t1 = time.perf_counter()
    for s in range(0, len(ok), args.xgrammar_batch):
        rows = ok[s: s + args.xgrammar_batch]
        outs.update(_generate(model, tok, info, [grammars[i] for i in rows], rows,
                              [prompt_of(tok, items[i][2]) for i in rows], args.max_new_tokens))
    gen_wall = time.perf_counter() - t1
    per = {sub: {"n": 0, "compiled": 0, "finished": 0, "valid": 0, "compile_s": []} for sub in subsets}
    bad = []
    for i, (sub, name, schema) in enumerate(items):
        per[sub]["n"] += 1
        if comp[i][0] is not None:
            per[sub]["compiled"] += 1
            per[sub]["compile_s"].append(comp[i][0])
        if i in outs and outs[i][1]:
            per[sub]["finished"] += 1
            good, why = validates(schema, outs[i][0])
            per[sub]["valid"] += good
            if not good:
                bad.append({"file": name, "why": why, "text": outs[i][0][:300]})
    errors = {items[i][1]: e for i, (_, e) in enumerate(comp) if e is not None}
    return {"per_subset": per, "invalid": bad, "compile_errors": errors, "compile_wall_s": compile_wall,
            "generate_wall_s": gen_wall}


def _generate(model, tok, info, grammars: list, rows: list[int], prompts: list[str], max_new: int) -> dict:
    """{row: (text, finished)} of greedy masked decoding, all rows in one batch."""
    import torch
    import xgrammar as xgr

    matchers = [xgr.GrammarMatcher(g) for g in grammars]
    enc = [tok.encode(p, add_special_tokens=False) for p in prompts]
    width = max(map(len, enc))
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    ids = torch.tensor([[pad] * (width - len(e)) + e for e in enc])
    mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in enc])
    bitmask = xgr.allocate_token_bitmask(len(rows), info.vocab_size)
    done = [False] * len(rows)
    finished = [False] * len(rows)
    out: list[list[int]] = [[] for _ in rows]
    past = None
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    step_ids = ids
    with torch.inference_mode():
        for _ in range(max_new):
            res = model(input_ids=step_ids, attention_mask=mask, position_ids=pos, past_key_values=past, use_cache=True)
            past = res.past_key_values
            logits = res.logits[:, -1, :].float()
            for r, m in enumerate(matchers):
                if not done[r]:
                    m.fill_next_token_bitmask(bitmask, r)
            xgr.apply_token_bitmask_inplace(logits, bitmask)
            nxt = logits.argmax(-1)
            for r, m in enumerate(matchers):
                if done[r]:
                    nxt[r] = pad
                    continue
                t = int(nxt[r])
                if not m.accept_token(t):  # (the mask allows only accepted tokens)
                    done[r] = True
                elif m.is_terminated():  # the stop token, where the grammar allows it
                    done[r] = finished[r] = True
                else:
                    out[r].append(t)
            if all(done):
                break
            step_ids = nxt.view(-1, 1)
            mask = torch.cat([mask, torch.ones(len(rows), 1, dtype=mask.dtype)], dim=1)
            pos = pos[:, -1:] + 1
    return {row: (tok.decode(o, skip_special_tokens=True), finished[r]) for r, (row, o) in enumerate(zip(rows, out))}
